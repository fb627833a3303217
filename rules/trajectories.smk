# Rules of stage trajectories (filled by its issue).
