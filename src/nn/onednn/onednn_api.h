/* The bfloat16 products of the compute layer (docs/spec.md §7), as a C interface to
 * libfp8lab_onednn.so: Debian's oneDNN 2.x behind a shared object of its own.
 *
 * PyTorch's wheel carries oneDNN 3.x inside libtorch_cpu, and both it and Debian's
 * libdnnl.so.2 export weak symbols of the same name whose code differs between the two
 * versions (call_once trampolines of oneDNN's GEMM set-up, docs/python.md "oneDNN"); in one
 * global symbol scope one library would run the other's code. So libfp8lab_onednn.so is
 * the only object that links libdnnl, is compiled against Debian's headers alone (no torch
 * include path, whose dnnl.hpp is 3.x), and is loaded by fp8lab_nn with
 * dlopen(RTLD_LOCAL | RTLD_DEEPBIND): its oneDNN binds to its own symbols first, and no
 * other object sees them (src/nn/onednn_loader.cpp).
 *
 * Every function returns NULL on success or an error message (valid until the calling
 * thread's next call). Shapes are in elements; strides in elements. */
#ifndef FP8LAB_ONEDNN_API_H
#define FP8LAB_ONEDNN_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP8LAB_ONEDNN_API_VERSION 1

/* The passes of a convolution. */
enum fp8lab_conv_pass { FP8LAB_CONV_FORWARD = 0, FP8LAB_CONV_INPUT_GRAD = 1, FP8LAB_CONV_WEIGHT_GRAD = 2 };

/* A convolution's shapes and geometry: input [n, c, h, w], weights [o, c/groups, kh, kw],
 * output [n, o, oh, ow]; stride, padding and dilation (torch's: 1 = no gap) per axis. */
struct fp8lab_conv_shape {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
  int64_t stride[2], padding[2], dilation[2], groups;
};

struct fp8lab_onednn_api {
  int version; /* FP8LAB_ONEDNN_API_VERSION */

  /* 1 when the CPU oneDNN runs on (after ONEDNN_MAX_CPU_ISA) has bfloat16 products
   * (AVX512-BF16 or AMX-BF16), else 0. */
  int (*bf16_products)(void);

  /* The ISA oneDNN runs on, as its name ("avx512_core_amx", ...). */
  const char* (*cpu_isa)(void);

  /* c = a b on bfloat16 a [batch?, m, k] and b [batch?, k, n] with float32 accumulation,
   * into row-major float32 c [batch?, m, n]. batch 0: plain matrices; else matrices back to
   * back (a's of m*k values, b's of k*n). a_rs/a_cs, b_rs/b_cs: row and column strides of
   * one matrix (each row- or column-major). */
  const char* (*matmul)(int64_t batch, int64_t m, int64_t k, int64_t n, int64_t a_rs, int64_t a_cs, int64_t b_rs,
                        int64_t b_cs, const void* a, const void* b, float* c);

  /* One pass of a convolution on two bfloat16 inputs, float32 output:
   *   forward:      in0 = x (NHWC),  in1 = w (OIHW),  out = y (NHWC)
   *   input grad:   in0 = gy (NHWC), in1 = w (OIHW),  out = gx (NHWC)
   *   weight grad:  in0 = gy (NHWC), in1 = x (NHWC),  out = gw (OIHW)
   * NHWC: a [n, ch, h, w] tensor laid out channels-last (torch's ChannelsLast). */
  const char* (*conv)(int pass, const struct fp8lab_conv_shape* shape, const void* in0, const void* in1, float* out);
};

/* The one symbol libfp8lab_onednn.so exports. */
const struct fp8lab_onednn_api* fp8lab_onednn(void);

#ifdef __cplusplus
}
#endif

#endif /* FP8LAB_ONEDNN_API_H */
