# Rules of stage models (filled by its issue).
