# Rules of stage release (filled by its issue).
