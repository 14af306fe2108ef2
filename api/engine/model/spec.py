"""Names the runtime binds on an edited graph, kept apart so the runtime reads them without
importing the graph edits (`graph/fused_attention.py` and `graph/last_logits.py` add them)."""

SEQLENS = "seqlens_k"  # int32 [batch]: each row's total length minus one
TOTAL = "total_sequence_length"  # int32 scalar: the longest row's total length
LOGITS_POSITIONS = "tokenshop_logits_positions"  # int64 [1]: last positions with logits (1)
