# Rules of stage train (filled by its issue).
