# Rules of stage judge (filled by its issue).
