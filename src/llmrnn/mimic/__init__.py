"""From PhysioNet files to the cohort: MIMIC-IV hosp/ + MIMIC-IV-Note discharge summaries.

sections: the section table (canonical section <- header variants) and the note splitter.
build: `llmrnn cohort build` (streams the notes, selects patients, writes the cohort + counts).
synth: `llmrnn cohort synth --format mimic-iv` (the five tables in the real layout, synthetic).
"""
