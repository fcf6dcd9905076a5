"""The tokenizer bridge: student ids -> text -> teacher's chat template -> teacher continues ->
text -> student ids, with seam checks (`distill bridge check`).

`bridge.py` converts ids through text with special tokens mapped by role or name (never leaked
as text); `seam.py` checks the round trips on whole corpora; `thinking.py` keeps one think block
per assistant turn. Used automatically by ROSE when student and teacher tokenizers differ.
"""
