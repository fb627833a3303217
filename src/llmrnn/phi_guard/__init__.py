"""PHI guard: scan a release bundle (the exact folder that would be uploaded) for the data it was made from.

The reference (what must not leak) depends on the recipe: the cohort's split files (memory_head), or the
QA records of the qa data stage (recipe qa: questions, contexts, free-text answers and reasonings, record
and group ids; for ECG QA they come from patients). Both are read into the same `Secrets` and scanned by
the same machinery below; findings name the reference ("cohort identifier", "QA data identifier").

FAIL CLOSED (accounting): a release bundle is a fixed set of file kinds and each file is accounted for
against what it must be, not searched for what it might hide: weights against the base model's architecture
(header metadata, tensor names, shapes, dtypes), tokenizer files byte for byte against the base model's
prepared copy, config.json / generation_config.json key by key against the base's and the settings that made
them, the card and manifest byte for byte against what the release writes again from the run's records. Any
other file, any link or folder, any difference is refused, the file named by its fixed name or, where its
name is not one a bundle may hold, by its position only. The deny-list machinery below is kept for what is
still scanned: user-supplied free text (the settings, tags and commit message the card and manifest are made
from; in a person's check of a folder, its card and manifest), read as a person reads it (NFKC, confusable
skeletons, bidi reordered, tag and filler characters removed, markdown rendered) and across JSON and table
structure, encoded data in it refused rather than decoded; and the tensor bytes of accounted-for weights.

What the scanned text is matched against:
- identifiers: the cohort's subject/visit ids in any form: digits grouped (`12 345`, `12,345`, `12-345`),
  other Unicode digits, full-width forms, look-alike letters of other scripts (Cyrillic `АВ7731Х`, via
  Unicode's confusables data) and O/l typed for 0/1, string ids (`MRN-AB7731X`, also its id-like part
  `AB7731X`), number literals by value (`0012345`, `0x3039`), `*_id` and signed JSON numbers, and in file
  names; for QA data also the identifiers written inside a record's texts (`MRN 12345678`). An id the QA
  data stage made up for a record without one is exempt by provenance (the record says `id_generated`),
  never by its shape;
- clinical text: `min_words` consecutive words of a clinical section (or of a QA record's question,
  context, reasoning or free-text answer), or a whole short line / list item of at least `min_line_words`
  words (a medication list), matched on decoded text, and on its letters alone (5 x `min_words` letters in a
  row) where the word breaks are hidden (`<wbr>`, zero-width or bidi characters, footnote marks between words);
- a date of birth from a note however the bundle spells it (3/14/56, March 14th, 1956, 14-mar-56);
- a name from a note (two or more capitalised words next to a name-like header, up to the next header;
  one word alone is a surname only) also reordered or with a word between its words
  (`Quist, Johanna`, `Johanna M. Quist`), and its surname alone where it names a person: after a title
  (`Mrs. Quist`), before an initial or a capitalised given name (`QUIST, J.`, `Quist, Maria`), possessive
  (`Quist's`); never bare, and a surname that is an ordinary word (`White`) only after a title or before an
  initial (identifiers.find_surnames);
- a credential-like string (hf_..., sk-..., ghp_..., AKIA..., a URL's user:password@) pasted anywhere.

Findings say what and where (file, offset or JSON path, kind) and never repeat the identifier or text.
Identifiers shorter than `min_id_digits` characters cannot be told apart from ordinary numbers and are
not matched; the report counts them. Clinical text is still matched for those patients.
"""

from __future__ import annotations

from llmrnn.phi_guard.bundle import enforce, scan_bundle
from llmrnn.phi_guard.secrets import SPLIT_FORMATS

__all__ = [
    "SPLIT_FORMATS",
    "enforce",
    "scan_bundle",
]
