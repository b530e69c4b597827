"""What instructors make for students: the release, the student kit, and the notebook's self-check."""
