# Rules of stage report (filled by its issue).
