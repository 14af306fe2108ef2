"""Names the runtime binds on an edited graph, kept apart so the runtime reads them without
importing the graph edits (`graph/fused_attention.py` adds these inputs)."""

SEQLENS = "seqlens_k"  # int32 [batch]: each row's total length minus one
TOTAL = "total_sequence_length"  # int32 scalar: the longest row's total length
