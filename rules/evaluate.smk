# Rules of stage evaluate (filled by its issue).
