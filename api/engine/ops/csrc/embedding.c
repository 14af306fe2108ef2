/* HeadEmbedding (domain "tokenshop"): a tied model's embedding rows, read from its LM head's
 * int8 weights (the B and scales of the head's Int8MatMul), so the model holds one table, not
 * two.
 *
 * Why: a tied model's export keeps the embedding as a float32 table beside the head's int8 copy
 * of it (151,936 x 896 floats, 545 MB, on a Qwen2.5-0.5B shape; 1.58 GB on Llama-3.2-3B's). ONNX
 * Runtime maps it from the model file, and the rows of a request's tokens fault it in: with the
 * kernel's read-ahead and large page-cache folios, a few hundred random tokens made 110-290 MB of
 * it resident (bench/results/2026-11-26-compare-zen4-e6ecaf7.md). Here a row is a column of the
 * head's weights, already held on 2 MB pages by the head's kernel (the two share that copy:
 * `tokenshop_share_weights`), times its scale: the int8 head's values, which the logits are
 * computed with anyway.
 *
 * Inputs: ids (int64, any shape), B and scales as Int8MatMul's (matmul.c: B [N / 8][K' / 8][2]
 * [8][4], K' = K rounded up to the block; scales [N / 8][K' / block][8]). Attributes K, N and
 * block_size, as the head's. Output: ids' shape + [K], float. An id outside [0, N) is an error,
 * as it is for ONNX Runtime's Gather.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "onnxruntime_c_api.h"
#include "ops.h"

typedef struct {
  int64_t k, n, block;
  const int8_t *weights; /* the shared copy of B, or NULL: B's input serves */
  SharedWeights *shared;
} EmbeddingKernel;

static int64_t padded_k(const EmbeddingKernel *e) {
  return (e->k + e->block - 1) / e->block * e->block;
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **kernel) {
  (void)op;
  (void)api;
  EmbeddingKernel e = {0};
  RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "K", &e.k));
  RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "N", &e.n));
  RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "block_size", &e.block));
  if (e.k <= 0 || e.n <= 0 || e.n % 8 || e.block <= 0 || e.block % 8)
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT,
                               "HeadEmbedding: needs K > 0, N % 8 == 0, block_size % 8 == 0");
  size_t bytes = (size_t)(e.n * padded_k(&e));
  e.weights = (const int8_t *)tokenshop_share_weights(info, 1, bytes, &e.shared);
  EmbeddingKernel *made = malloc(sizeof(EmbeddingKernel));
  if (made == NULL) {
    tokenshop_release_weights(e.shared);
    return g_api->CreateStatus(ORT_FAIL, "HeadEmbedding: out of memory");
  }
  *made = e;
  *kernel = made;
  return NULL;
}

/* Input `index`'s data and element count. */
static OrtStatus *input(OrtKernelContext *context, size_t index, const void **data,
                        size_t *elements) {
  const OrtValue *value;
  RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, index, &value));
  OrtTensorTypeAndShapeInfo *info;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  OrtStatus *status = g_api->GetTensorShapeElementCount(info, elements);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (status != NULL) return status;
  return g_api->GetTensorMutableData((OrtValue *)value, (void **)data);
}

/* Row `id` of the table: column `id` of the head's weights, each block's times its scale. */
static void row(const EmbeddingKernel *e, const int8_t *b, const float *scales, int64_t id,
                float *out) {
  int64_t groups = padded_k(e) / 8, blocks = padded_k(e) / e->block;
  int64_t panel = id / 8, column = id % 8;
  const int8_t *w = b + panel * groups * 64 + column * 4; /* a group: [2][8 columns][4] */
  const float *s = scales + panel * blocks * 8 + column;
  for (int64_t g = 0; g < groups; g++, w += 64) {
    float scale = s[(g * 8 / e->block) * 8];
    for (int64_t j = 0; j < 4; j++) {
      int64_t even = g * 8 + 2 * j; /* pair j of the group: weights 2j (even), 2j + 1 (odd) */
      if (even < e->k) out[even] = (float)w[j] * scale;
      if (even + 1 < e->k) out[even + 1] = (float)w[32 + j] * scale;
    }
  }
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *context) {
  const EmbeddingKernel *e = kernel;
  const OrtValue *ids_value;
  RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, 0, &ids_value));
  OrtTensorTypeAndShapeInfo *shape_info;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(ids_value, &shape_info));
  size_t rank = 0;
  int64_t dims[9];
  OrtStatus *status = g_api->GetDimensionsCount(shape_info, &rank);
  if (status == NULL && rank > 8)
    status = g_api->CreateStatus(ORT_INVALID_ARGUMENT, "HeadEmbedding: ids of rank 0 to 8");
  if (status == NULL) status = g_api->GetDimensions(shape_info, dims, rank);
  g_api->ReleaseTensorTypeAndShapeInfo(shape_info);
  if (status != NULL) return status;
  const int64_t *ids;
  const int8_t *b;
  const float *scales;
  size_t count, b_count, scale_count;
  RETURN_IF_ERROR(input(context, 0, (const void **)&ids, &count));
  RETURN_IF_ERROR(input(context, 1, (const void **)&b, &b_count));
  RETURN_IF_ERROR(input(context, 2, (const void **)&scales, &scale_count));
  int64_t b_bytes = e->n * padded_k(e);
  if ((int64_t)b_count != b_bytes || (int64_t)scale_count != b_bytes / e->block)
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT,
                               "HeadEmbedding: B or scales do not match K, N, block_size");
  if (e->weights != NULL) b = e->weights;
  dims[rank] = e->k;
  OrtValue *out_value;
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, dims, rank + 1, &out_value));
  float *out;
  RETURN_IF_ERROR(g_api->GetTensorMutableData(out_value, (void **)&out));
  for (size_t i = 0; i < count; i++) {
    if (ids[i] < 0 || ids[i] >= e->n)
      return g_api->CreateStatus(ORT_INVALID_ARGUMENT,
                                 "HeadEmbedding: a token id is out of range");
    row(e, b, scales, ids[i], out + (int64_t)i * e->k);
  }
  return NULL;
}

static void ORT_API_CALL destroy_kernel(void *kernel) {
  tokenshop_release_weights(((EmbeddingKernel *)kernel)->shared);
  free(kernel);
}

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) {
  (void)op;
  return "HeadEmbedding";
}

static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  static const ONNXTensorElementDataType types[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  return types[index];
}

static size_t ORT_API_CALL input_count(const OrtCustomOp *op) {
  (void)op;
  return 3;
}

static size_t ORT_API_CALL output_count(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_characteristic(
    const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return INPUT_OUTPUT_REQUIRED;
}

void tokenshop_fill_embedding(OrtCustomOp *op) {
  static const OpCallbacks callbacks = {
      .name = op_name,
      .input_type = input_type,
      .input_count = input_count,
      .output_count = output_count,
      .input_characteristic = input_characteristic,
      .create = create_kernel,
      .compute = compute,
      .destroy = destroy_kernel,
  };
  tokenshop_fill_op(op, &callbacks);
}
