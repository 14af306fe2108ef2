/* The library's entry point: ONNX Runtime calls `RegisterCustomOps` when a session's options
 * register the library, and gets one domain ("tokenshop") holding every op: Int4MatMul and
 * Int8MatMul (matmul.c), CachedAttention and CachedAttentionHalfCache (attention.c),
 * HeadEmbedding (embedding.c). Also what the op files share (ops.h), and the CPU check the
 * engine makes before it edits a graph. */
#include <pthread.h>
#include <stddef.h>

#include "ops.h"

const OrtApi *g_api;

/* Whether this CPU runs the library's kernels: the engine asks before it edits a graph. */
int tokenshop_ops_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c"); /* every AVX2 CPU has it; attention's half cache */
}

OrtStatus *tokenshop_input(OrtKernelContext *context, size_t index, const OrtValue **value) {
  size_t count;
  RETURN_IF_ERROR(g_api->KernelContext_GetInputCount(context, &count));
  *value = NULL;
  if (index < count) RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, index, value));
  return NULL;
}

static const char *ORT_API_CALL op_provider(const OrtCustomOp *op) {
  (void)op;
  return "CPUExecutionProvider";
}

static ONNXTensorElementDataType ORT_API_CALL float_output(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_characteristic(
    const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return INPUT_OUTPUT_REQUIRED;
}

static OrtMemType ORT_API_CALL memory_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return OrtMemTypeDefault;
}

static int ORT_API_CALL start_version(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static int ORT_API_CALL end_version(const OrtCustomOp *op) {
  (void)op;
  return 1 << 30;
}

void tokenshop_fill_op(OrtCustomOp *op, const OpCallbacks *callbacks) {
  op->version = ORT_API_VERSION;
  op->GetExecutionProviderType = op_provider;
  op->GetInputMemoryType = memory_type;
  op->GetOutputCharacteristic = output_characteristic;
  op->GetStartVersion = start_version;
  op->GetEndVersion = end_version;
  op->GetName = callbacks->name;
  op->GetInputType = callbacks->input_type;
  op->GetOutputType = callbacks->output_type != NULL ? callbacks->output_type : float_output;
  op->GetInputTypeCount = callbacks->input_count;
  op->GetOutputTypeCount = callbacks->output_count;
  op->GetInputCharacteristic = callbacks->input_characteristic;
  op->CreateKernelV2 = callbacks->create;
  op->KernelComputeV2 = callbacks->compute;
  op->KernelDestroy = callbacks->destroy;
}

static MatMulOp g_int4, g_int8;
static AttentionOp g_attention, g_attention_half;
static OrtCustomOp g_embedding;
static OrtCustomOpDomain *g_domain;
static OrtStatus *g_domain_error;
static pthread_once_t g_domain_once = PTHREAD_ONCE_INIT;

/* Once per process: every session shares the ops and their domain, which live as long as it. */
static void make_domain(void) {
  tokenshop_fill_matmul(&g_int4, 4);
  tokenshop_fill_matmul(&g_int8, 8);
  tokenshop_fill_attention(&g_attention, 0);
  tokenshop_fill_attention(&g_attention_half, 1);
  tokenshop_fill_embedding(&g_embedding);
  OrtCustomOp *ops[] = {&g_int4.op, &g_int8.op, &g_attention.op, &g_attention_half.op,
                        &g_embedding};
  g_domain_error = g_api->CreateCustomOpDomain("tokenshop", &g_domain);
  for (size_t i = 0; i < sizeof ops / sizeof ops[0] && g_domain_error == NULL; i++)
    g_domain_error = g_api->CustomOpDomain_Add(g_domain, ops[i]);
}

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  g_api = base->GetApi(ORT_API_VERSION);
  if (g_api == NULL) return NULL; /* an ONNX Runtime older than our header: cannot say why */
  if (!tokenshop_ops_supported())
    return g_api->CreateStatus(ORT_FAIL, "tokenshop ops: this CPU lacks AVX2 and FMA");
  pthread_once(&g_domain_once, make_domain);
  if (g_domain_error != NULL)
    return g_api->CreateStatus(g_api->GetErrorCode(g_domain_error),
                               g_api->GetErrorMessage(g_domain_error));
  return g_api->AddCustomOpDomain(options, g_domain);
}
