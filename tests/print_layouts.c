/* print_layouts.c - the C side of tests/test_binding_layout.py.
 *
 * The Python binding (python/coda/_lib.py) restates coda.h's structures
 * and enum values with ctypes, and tests/test_layer_torch.py restates the
 * leading fields of the reference layer (tests/oracle/reference.h). ctypes
 * cannot read a C header, so nothing but a test keeps the two in step: this
 * program prints, as JSON, what the C compiler made of each structure (size,
 * alignment, every field's offset and size) and the value of each enum
 * constant the binding uses; the Python test compares its ctypes classes
 * with it. A field added, removed, reordered or resized on one side only
 * fails there, instead of as a call that reads the wrong bytes. */
#include "coda.h"
#include "oracle/reference.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>

static int first_struct = 1, first_field;

static void struct_begin(const char *name, size_t size, size_t align) {
    printf("%s\n  \"%s\": {\"size\": %zu, \"align\": %zu, \"fields\": [", first_struct ? "" : ",", name, size,
           align);
    first_struct = 0;
    first_field = 1;
}

static void field(const char *name, size_t offset, size_t size) {
    printf("%s\n    [\"%s\", %zu, %zu]", first_field ? "" : ",", name, offset, size);
    first_field = 0;
}

static void struct_end(void) { printf("]}"); }

#define STRUCT(T) struct_begin(#T, sizeof(T), alignof(T))
#define FIELD(T, f) field(#f, offsetof(T, f), sizeof(((T *)0)->f))

static int first_const = 1;

static void constant(const char *name, long long value) {
    printf("%s\n  \"%s\": %lld", first_const ? "" : ",", name, value);
    first_const = 0;
}

#define CONST(c) constant(#c, (long long)(c))

int main(void) {
    printf("{\"structs\": {");

    STRUCT(coda_tensor_t);
    FIELD(coda_tensor_t, data);
    FIELD(coda_tensor_t, dtype);
    FIELD(coda_tensor_t, device);
    FIELD(coda_tensor_t, device_index);
    FIELD(coda_tensor_t, ndim);
    FIELD(coda_tensor_t, shape);
    FIELD(coda_tensor_t, stride);
    struct_end();

    STRUCT(coda_binding_t);
    FIELD(coda_binding_t, name);
    FIELD(coda_binding_t, tensor);
    FIELD(coda_binding_t, scalar);
    struct_end();

    STRUCT(coda_tiling_t);
    FIELD(coda_tiling_t, tile_m);
    FIELD(coda_tiling_t, tile_n);
    struct_end();

    STRUCT(coda_context_options_t);
    FIELD(coda_context_options_t, cpu_threads);
    FIELD(coda_context_options_t, cache_dir);
    struct_end();

    STRUCT(coda_llama_config_t);
    FIELD(coda_llama_config_t, d);
    FIELD(coda_llama_config_t, n_heads);
    FIELD(coda_llama_config_t, n_kv_heads);
    FIELD(coda_llama_config_t, head_dim);
    FIELD(coda_llama_config_t, ffn);
    FIELD(coda_llama_config_t, vocab);
    FIELD(coda_llama_config_t, eps);
    FIELD(coda_llama_config_t, rope_theta);
    struct_end();

    STRUCT(coda_llama_weights_t);
    FIELD(coda_llama_weights_t, g1);
    FIELD(coda_llama_weights_t, wqkv);
    FIELD(coda_llama_weights_t, wo);
    FIELD(coda_llama_weights_t, g2);
    FIELD(coda_llama_weights_t, wgu);
    FIELD(coda_llama_weights_t, wd);
    FIELD(coda_llama_weights_t, gf);
    FIELD(coda_llama_weights_t, wlm);
    struct_end();

    STRUCT(coda_lm_loss_opts_t);
    FIELD(coda_lm_loss_opts_t, ignore_index);
    FIELD(coda_lm_loss_opts_t, label_smoothing);
    FIELD(coda_lm_loss_opts_t, z_loss);
    FIELD(coda_lm_loss_opts_t, softcap);
    FIELD(coda_lm_loss_opts_t, grad_scale);
    FIELD(coda_lm_loss_opts_t, reduction);
    FIELD(coda_lm_loss_opts_t, accumulate);
    FIELD(coda_lm_loss_opts_t, chunk_rows);
    struct_end();

    STRUCT(coda_attention_shape_t);
    FIELD(coda_attention_shape_t, batch);
    FIELD(coda_attention_shape_t, seq);
    FIELD(coda_attention_shape_t, n_heads);
    FIELD(coda_attention_shape_t, n_kv_heads);
    FIELD(coda_attention_shape_t, head_dim);
    struct_end();

    STRUCT(coda_block_acts_t);
    FIELD(coda_block_acts_t, r1);
    FIELD(coda_block_acts_t, qkv);
    FIELD(coda_block_acts_t, h);
    FIELD(coda_block_acts_t, r2);
    FIELD(coda_block_acts_t, z);
    FIELD(coda_block_acts_t, spend_z);
    FIELD(coda_block_acts_t, c);
    struct_end();

    STRUCT(coda__ref_weights_t);
    FIELD(coda__ref_weights_t, wq);
    FIELD(coda__ref_weights_t, wk);
    FIELD(coda__ref_weights_t, wv);
    FIELD(coda__ref_weights_t, wo);
    FIELD(coda__ref_weights_t, w_gate);
    FIELD(coda__ref_weights_t, w_up);
    FIELD(coda__ref_weights_t, w_down);
    FIELD(coda__ref_weights_t, g1);
    FIELD(coda__ref_weights_t, g2);
    FIELD(coda__ref_weights_t, gf);
    FIELD(coda__ref_weights_t, wlm);
    struct_end();

    /* Only the leading fields: the Python side declares no more (it never
     * allocates one, it reads the layer coda__ref_create made). */
    STRUCT(coda__ref_layer_t);
    FIELD(coda__ref_layer_t, cfg);
    FIELD(coda__ref_layer_t, batch);
    FIELD(coda__ref_layer_t, seq);
    FIELD(coda__ref_layer_t, m);
    FIELD(coda__ref_layer_t, nq);
    FIELD(coda__ref_layer_t, nkv);
    FIELD(coda__ref_layer_t, w);
    FIELD(coda__ref_layer_t, x);
    FIELD(coda__ref_layer_t, targets);
    FIELD(coda__ref_layer_t, use_loss);
    FIELD(coda__ref_layer_t, loss_scale);
    FIELD(coda__ref_layer_t, dy);
    FIELD(coda__ref_layer_t, use_dy);
    FIELD(coda__ref_layer_t, y);
    FIELD(coda__ref_layer_t, loss);
    FIELD(coda__ref_layer_t, dx);
    FIELD(coda__ref_layer_t, grad);
    struct_end();

    printf("},\n\"constants\": {");
    CONST(CODA_MAX_DIMS);
    CONST(CODA_BF16);
    CONST(CODA_F32);
    CONST(CODA_F16);
    CONST(CODA_FP8_E4M3);
    CONST(CODA_I32);
    CONST(CODA_I64);
    CONST(CODA_DEVICE_CPU);
    CONST(CODA_DEVICE_CUDA);
    CONST(CODA_LAYOUT_NT);
    CONST(CODA_LAYOUT_NN);
    CONST(CODA_LAYOUT_TN);
    CONST(CODA_REDUCE_SUM);
    CONST(CODA_REDUCE_MAX);
    CONST(CODA_REDUCE_SUMSQ);
    CONST(CODA_IN_TILE);
    CONST(CODA_IN_ROW);
    CONST(CODA_IN_COL);
    CONST(CODA_IN_SCALAR);
    CONST(CODA_OUT_TILE);
    CONST(CODA_OUT_ROWRED);
    CONST(CODA_OUT_COLRED);
    CONST(CODA_OUT_LSE);
    CONST(CODA_IN_ROWPART);
    CONST(CODA_SPACE_HALF);
    CONST(CODA_SPACE_FULL);
    CONST(CODA_SPACE_DOUBLE);
    CONST(CODA_BLOCK_FORWARD_PRE);
    CONST(CODA_BLOCK_FORWARD_POST);
    CONST(CODA_BLOCK_BACKWARD_POST);
    CONST(CODA_BLOCK_BACKWARD_PRE);
    CONST(CODA_BLOCK_BACKWARD_POST_SPEND_Z);
    CONST(CODA_BLOCK_BACKWARD_POST_KEPT_C);
    CONST(CODA_BLOCK_BACKWARD_POST_SPEND_Z_KEPT_C);
    CONST(CODA_BLOCK_FORWARD_POST_KEPT_C);
    CONST(CODA_LM_MEAN);
    CONST(CODA_LM_SUM);
    CONST(CODA__REF_F64);
    CONST(CODA__REF_BF16);
    printf("}}\n");
    return 0;
}
