"""The whole class: the roster, the record, grading many submissions, and the class's outputs."""
