# Rules of stage merge (filled by its issue).
