/* What the library's op files share: ONNX Runtime's API table (set when the library is
 * registered, before any kernel is made) and the parts of an OrtCustomOp every op fills alike. */
#ifndef TOKENSHOP_OPS_H
#define TOKENSHOP_OPS_H

#include "onnxruntime_c_api.h"

extern const OrtApi *g_api;

#define RETURN_IF_ERROR(expr)            \
  do {                                   \
    OrtStatus *status_ = (expr);         \
    if (status_ != NULL) return status_; \
  } while (0)

/* Version, execution provider (CPU), memory types, outputs (float, required) and opset range
 * (int4_matmul.c). */
void tokenshop_fill_common(OrtCustomOp *op);

/* Input `index` of a kernel's node, or NULL for an optional input the node leaves out
 * (int4_matmul.c). */
OrtStatus *tokenshop_input(OrtKernelContext *context, size_t index, const OrtValue **value);

/* CachedAttention (attention.c): its kernel and type callbacks; with `half_cache` the op whose
 * past and present keys and values are float16 (CachedAttentionHalfCache). */
typedef struct {
  OrtCustomOp op; /* first: ONNX Runtime hands the callbacks this address back */
  int half_cache;
} AttentionOp;

void tokenshop_fill_attention(AttentionOp *op, int half_cache);

#endif
