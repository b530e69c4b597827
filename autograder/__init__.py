"""The autograder for the parallel-attention-heads exercise: a trusted grader and an untrusted worker."""

import sys

# jsonschema (imported by nbformat and nbgrader) compiles some forty grammars of rfc3987_syntax when it is
# imported, about a second, for its "iri" format checker; no notebook schema uses that format, and every
# command here reads or writes notebooks sooner or later. Without the module, jsonschema leaves the format
# unchecked, as it does wherever rfc3987_syntax is not installed.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
