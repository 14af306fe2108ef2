/* What the library's op files share: ONNX Runtime's API table (set when the library is
 * registered, before any kernel is made), the input accessor, and the one place an OrtCustomOp's
 * callback table is filled (ops.c). */
#ifndef TOKENSHOP_OPS_H
#define TOKENSHOP_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "onnxruntime_c_api.h"

extern const OrtApi *g_api;

#define RETURN_IF_ERROR(expr)            \
  do {                                   \
    OrtStatus *status_ = (expr);         \
    if (status_ != NULL) return status_; \
  } while (0)

/* The callbacks that differ between ops; `output_type` may be NULL: every output float. */
typedef struct {
  const char *(ORT_API_CALL *name)(const OrtCustomOp *op);
  ONNXTensorElementDataType(ORT_API_CALL *input_type)(const OrtCustomOp *op, size_t index);
  ONNXTensorElementDataType(ORT_API_CALL *output_type)(const OrtCustomOp *op, size_t index);
  size_t(ORT_API_CALL *input_count)(const OrtCustomOp *op);
  size_t(ORT_API_CALL *output_count)(const OrtCustomOp *op);
  OrtCustomOpInputOutputCharacteristic(ORT_API_CALL *input_characteristic)(const OrtCustomOp *op,
                                                                           size_t index);
  OrtStatus *(ORT_API_CALL *create)(const OrtCustomOp *op, const OrtApi *api,
                                    const OrtKernelInfo *info, void **kernel);
  OrtStatus *(ORT_API_CALL *compute)(void *kernel, OrtKernelContext *context);
  void(ORT_API_CALL *destroy)(void *kernel);
} OpCallbacks;

/* Fill `op` with `callbacks` and what every op of the library shares: the API version, the CPU
 * execution provider, default memory, required outputs, every opset version. */
void tokenshop_fill_op(OrtCustomOp *op, const OpCallbacks *callbacks);

/* Input `index` of a kernel's node, or NULL for an optional input the node leaves out. */
OrtStatus *tokenshop_input(OrtKernelContext *context, size_t index, const OrtValue **value);

/* Weights on 2 MB pages, one copy per constant however many kernels read it (matmul.c):
 * input `index` of a kernel's node when it is a constant of `bytes` bytes, else NULL. A kernel
 * holding a copy releases it when it is destroyed. */
typedef struct SharedWeights SharedWeights;
const uint8_t *tokenshop_share_weights(const OrtKernelInfo *info, size_t index, size_t bytes,
                                       SharedWeights **handle);
void tokenshop_release_weights(SharedWeights *handle);

/* Int4MatMul (bits 4) and Int8MatMul (bits 8): matmul.c. */
typedef struct {
  OrtCustomOp op; /* first: ONNX Runtime hands the callbacks this address back */
  int bits;
} MatMulOp;

void tokenshop_fill_matmul(MatMulOp *op, int bits);

/* CachedAttention (attention.c); with `half_cache` the op whose past and present keys and values
 * are float16 (CachedAttentionHalfCache). */
typedef struct {
  OrtCustomOp op; /* first: ONNX Runtime hands the callbacks this address back */
  int half_cache;
} AttentionOp;

void tokenshop_fill_attention(AttentionOp *op, int half_cache);

/* HeadEmbedding (embedding.c). */
void tokenshop_fill_embedding(OrtCustomOp *op);

#endif
