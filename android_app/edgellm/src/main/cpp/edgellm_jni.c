/* JNI bridge: ai.edgellm.NativeBridge (Kotlin) over libedgellm's C API (edgellm.h).
 *
 * Handles are pointers carried as Java longs: a model is el_model*, a context is a jctx (el_context* plus the cancel
 * flag the UI thread sets). Generation is el_generate, the one C loop every front end calls; its events come back
 * to the Kotlin listener as (token id, UTF-8 bytes) upcalls on the generating thread. Text crosses as byte arrays,
 * never through NewStringUTF/GetStringUTFChars: JNI's "modified UTF-8" mangles characters outside the BMP (emoji).
 * Every failure throws ai.edgellm.EdgeLLMException with el_last_error()'s one line. */
#include <jni.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edgellm.h"

#define FN(name) Java_ai_edgellm_NativeBridge_##name

typedef struct {
  el_context* c;
  atomic_int cancel; /* set by cancel() from any thread; the next event stops the generation */
} jctx;

static void throw_error(JNIEnv* env, const char* what) {
  if ((*env)->ExceptionCheck(env)) return; /* a pending Java exception says more */
  jclass cls = (*env)->FindClass(env, "ai/edgellm/EdgeLLMException");
  if (!cls) return; /* FindClass threw NoClassDefFoundError */
  const char* err = el_last_error();
  char msg[1024];
  snprintf(msg, sizeof msg, "%s%s%s", what ? what : "", what && err && *err ? ": " : "", err ? err : "");
  (*env)->ThrowNew(env, cls, msg);
}

/* A Java String -> malloc'd UTF-8 copy (NULL for null): the Kotlin side passes paths and names as byte arrays. */
static char* dup_bytes(JNIEnv* env, jbyteArray a) {
  if (!a) return NULL;
  jsize n = (*env)->GetArrayLength(env, a);
  char* s = malloc((size_t)n + 1);
  if (!s) return NULL;
  (*env)->GetByteArrayRegion(env, a, 0, n, (jbyte*)s);
  s[n] = 0;
  return s;
}

static jintArray int_array(JNIEnv* env, const int32_t* v, int n) {
  jintArray a = (*env)->NewIntArray(env, n);
  if (a && n > 0) (*env)->SetIntArrayRegion(env, a, 0, n, (const jint*)v);
  return a;
}

static jbyteArray byte_array(JNIEnv* env, const char* v, int n) {
  jbyteArray a = (*env)->NewByteArray(env, n);
  if (a && n > 0) (*env)->SetByteArrayRegion(env, a, 0, n, (const jbyte*)v);
  return a;
}

/* ---- model ---------------------------------------------------------------------------------------------------- */

JNIEXPORT jlong JNICALL FN(modelLoad)(JNIEnv* env, jclass cls, jbyteArray path, jint threads, jbyteArray budget,
                                      jbyteArray policy, jint prefill, jbyteArray device, jbyteArray digest) {
  (void)cls;
  char *p = dup_bytes(env, path), *bud = dup_bytes(env, budget), *pol = dup_bytes(env, policy),
       *dev = dup_bytes(env, device), *dig = dup_bytes(env, digest);
  el_model* m = NULL;
  el_load_options o;
  el_load_options_init(&o);
  char backend_opts[1024] = ""; /* the device is the OpenCL backend's own option */
  if (!p) {
    jclass e = (*env)->FindClass(env, "ai/edgellm/EdgeLLMException");
    if (e) (*env)->ThrowNew(env, e, "no package path given");
  } else if (bud && el_parse_bytes(bud, &o.memory_budget) != 0) { /* the one reader of sizes every front end uses */
    throw_error(env, "memoryBudget");
  } else if (dev && el_backend_options_add(backend_opts, sizeof backend_opts, "opencl", "device", dev) != 0) {
    throw_error(env, "device");
  } else {
    o.n_threads = threads;
    o.weight_policy = pol;
    o.prefill_backend = prefill;
    o.backend_options = backend_opts[0] ? backend_opts : NULL;
    o.digest = dig;
    m = el_model_load(p, &o);
    if (!m) throw_error(env, NULL);
  }
  free(p), free(bud), free(pol), free(dev), free(dig);
  return (jlong)(intptr_t)m;
}

JNIEXPORT void JNICALL FN(modelFree)(JNIEnv* env, jclass cls, jlong h) {
  (void)env, (void)cls;
  el_model_free((el_model*)(intptr_t)h);
}

/* [vocab, max context, prefill chunk, threads, prefill backend (EL_PREFILL_*), bos id, has tokenizer] */
JNIEXPORT jintArray JNICALL FN(modelInfo)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  const el_model* m = (const el_model*)(intptr_t)h;
  int32_t v[7] = {el_vocab(m), el_max_context(m), el_chunk(m), el_model_threads(m),
                  el_model_prefill_backend(m, NULL, 0), el_bos_id(m), el_has_tokenizer(m)};
  return int_array(env, v, 7);
}

JNIEXPORT jintArray JNICALL FN(eosIds)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  int32_t ids[64];
  int n = el_eos_ids((const el_model*)(intptr_t)h, ids, 64);
  return int_array(env, ids, n < 0 ? 0 : n > 64 ? 64 : n);
}

/* The OpenCL device of GPU packages ("" on the CPU), and why an NPU asked for with AUTO did not open ("" if it did). */
JNIEXPORT jbyteArray JNICALL FN(modelDevice)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  char buf[512];
  int n = el_model_device((const el_model*)(intptr_t)h, buf, sizeof buf);
  return byte_array(env, buf, n < 0 ? 0 : n >= (int)sizeof buf ? (int)sizeof buf - 1 : n);
}

JNIEXPORT jbyteArray JNICALL FN(prefillNote)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  char buf[512] = {0};
  el_model_prefill_backend((const el_model*)(intptr_t)h, buf, sizeof buf);
  return byte_array(env, buf, (int)strlen(buf));
}

/* [weights bytes, weights held in memory, bytes streamed per token, one context's KV + arena, budget] */
JNIEXPORT jlongArray JNICALL FN(modelMemory)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  el_memory_plan p;
  memset(&p, 0, sizeof p);
  el_model_memory((const el_model*)(intptr_t)h, &p);
  jlong v[5] = {(jlong)p.weights_bytes, (jlong)p.pinned_bytes, (jlong)p.streamed_bytes, (jlong)p.context_bytes,
                (jlong)p.budget};
  jlongArray a = (*env)->NewLongArray(env, 5);
  if (a) (*env)->SetLongArrayRegion(env, a, 0, 5, v);
  return a;
}

JNIEXPORT jintArray JNICALL FN(encode)(JNIEnv* env, jclass cls, jlong h, jbyteArray text, jint add_special) {
  (void)cls;
  const el_model* m = (const el_model*)(intptr_t)h;
  jsize len = text ? (*env)->GetArrayLength(env, text) : 0;
  char* s = dup_bytes(env, text);
  if (!s && len) return NULL;
  int n = el_encode(m, s ? s : "", len, add_special, NULL, 0);
  jintArray out = NULL;
  if (n < 0) {
    throw_error(env, "encode");
  } else {
    int32_t* ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (ids) {
      n = el_encode(m, s ? s : "", len, add_special, ids, n);
      out = int_array(env, ids, n);
      free(ids);
    }
  }
  free(s);
  return out;
}

JNIEXPORT jbyteArray JNICALL FN(tokenText)(JNIEnv* env, jclass cls, jlong h, jint id) {
  (void)cls;
  char buf[256];
  int n = el_token_text((const el_model*)(intptr_t)h, id, buf, sizeof buf);
  if (n < 0) {
    throw_error(env, "token text");
    return NULL;
  }
  if (n > (int)sizeof buf) { /* a long piece: ask again with room for it */
    char* big = malloc((size_t)n);
    if (!big) return NULL;
    n = el_token_text((const el_model*)(intptr_t)h, id, big, n);
    jbyteArray a = byte_array(env, big, n);
    free(big);
    return a;
  }
  return byte_array(env, buf, n);
}

/* ---- output constraints (an automaton from `edgellm schema`) ---------------------------------------------------- */

JNIEXPORT jlong JNICALL FN(constraintLoad)(JNIEnv* env, jclass cls, jbyteArray path) {
  (void)cls;
  char* p = dup_bytes(env, path);
  el_constraint* a = p ? el_constraint_load(p) : NULL;
  if (!a) throw_error(env, p ? "constraint" : "constraint: out of memory");
  free(p);
  return (jlong)(intptr_t)a;
}

JNIEXPORT void JNICALL FN(constraintFree)(JNIEnv* env, jclass cls, jlong h) {
  (void)env, (void)cls;
  el_constraint_free((el_constraint*)(intptr_t)h);
}

/* A draft model for `model`: the same vocabulary, token for token (el_draft_check); throws where they differ. */
JNIEXPORT void JNICALL FN(draftCheck)(JNIEnv* env, jclass cls, jlong model, jlong draft) {
  (void)cls;
  if (el_draft_check((el_model*)(intptr_t)model, (el_model*)(intptr_t)draft) != 0) throw_error(env, NULL);
}

/* ---- context -------------------------------------------------------------------------------------------------- */

JNIEXPORT jlong JNICALL FN(contextNew)(JNIEnv* env, jclass cls, jlong model, jint threads) {
  (void)cls;
  jctx* j = calloc(1, sizeof *j);
  if (!j) {
    throw_error(env, "out of memory");
    return 0;
  }
  j->c = el_context_new((el_model*)(intptr_t)model, threads);
  if (!j->c) {
    free(j);
    throw_error(env, NULL);
    return 0;
  }
  atomic_init(&j->cancel, 0);
  return (jlong)(intptr_t)j;
}

JNIEXPORT void JNICALL FN(contextFree)(JNIEnv* env, jclass cls, jlong h) {
  (void)env, (void)cls;
  jctx* j = (jctx*)(intptr_t)h;
  if (!j) return;
  el_context_free(j->c);
  free(j);
}

JNIEXPORT jint JNICALL FN(contextPos)(JNIEnv* env, jclass cls, jlong h) {
  (void)env, (void)cls;
  return el_pos(((jctx*)(intptr_t)h)->c);
}

JNIEXPORT jint JNICALL FN(contextThreads)(JNIEnv* env, jclass cls, jlong h) {
  (void)env, (void)cls;
  return el_context_threads(((jctx*)(intptr_t)h)->c);
}

JNIEXPORT void JNICALL FN(contextReset)(JNIEnv* env, jclass cls, jlong h) {
  (void)env, (void)cls;
  el_reset(((jctx*)(intptr_t)h)->c);
}

/* The conversation to a file and back (el_context_save / el_context_load: atomic, checked against the package). */
JNIEXPORT void JNICALL FN(contextSave)(JNIEnv* env, jclass cls, jlong h, jbyteArray path) {
  (void)cls;
  char* p = dup_bytes(env, path);
  if (!p) {
    throw_error(env, "out of memory");
    return;
  }
  if (el_context_save(((jctx*)(intptr_t)h)->c, p, -1) != 0) throw_error(env, NULL);
  free(p);
}

JNIEXPORT jint JNICALL FN(contextLoad)(JNIEnv* env, jclass cls, jlong h, jbyteArray path) {
  (void)cls;
  char* p = dup_bytes(env, path);
  if (!p) {
    throw_error(env, "out of memory");
    return -1;
  }
  int n = el_context_load(((jctx*)(intptr_t)h)->c, p);
  free(p);
  if (n < 0) throw_error(env, NULL);
  return n;
}

JNIEXPORT jintArray JNICALL FN(contextTokens)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  el_context* c = ((jctx*)(intptr_t)h)->c;
  int n = el_context_tokens(c, NULL, 0);
  int32_t* ids = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (!ids) {
    throw_error(env, "out of memory");
    return NULL;
  }
  n = el_context_tokens(c, ids, n); /* the count again: nothing runs on it meanwhile (the caller holds it) */
  jintArray a = int_array(env, ids, n);
  free(ids);
  return a;
}

JNIEXPORT void JNICALL FN(cancel)(JNIEnv* env, jclass cls, jlong h) {
  (void)env, (void)cls;
  atomic_store(&((jctx*)(intptr_t)h)->cancel, 1);
}

/* [weights resident, KV bytes, arena bytes, context bytes, prefill tokens, decode tokens, io bytes read,
 *  weight bytes read, verify passes, drafts verified, drafts taken, the draft model's drafts, those taken, the
 *  branches taken] and [prefill s, decode s, io stall s] */
JNIEXPORT jlongArray JNICALL FN(statsCounts)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  el_stats s;
  el_get_stats(((jctx*)(intptr_t)h)->c, &s);
  jlong v[] = {(jlong)s.weight_bytes_resident, (jlong)s.kv_bytes, (jlong)s.arena_bytes, (jlong)s.context_bytes,
                (jlong)s.prefill_tokens, (jlong)s.decode_tokens, (jlong)s.io_bytes_read, (jlong)s.weight_bytes_read,
                (jlong)s.spec_passes, (jlong)s.spec_drafted, (jlong)s.spec_accepted, (jlong)s.spec_drafted_model,
                (jlong)s.spec_accepted_model, (jlong)s.spec_accepted_branch};
  jsize n = (jsize)(sizeof v / sizeof v[0]);
  jlongArray a = (*env)->NewLongArray(env, n);
  if (a) (*env)->SetLongArrayRegion(env, a, 0, n, v);
  return a;
}

JNIEXPORT jdoubleArray JNICALL FN(statsTimes)(JNIEnv* env, jclass cls, jlong h) {
  (void)cls;
  el_stats s;
  el_get_stats(((jctx*)(intptr_t)h)->c, &s);
  jdouble v[3] = {s.prefill_seconds, s.decode_seconds, s.io_stall_seconds};
  jdoubleArray a = (*env)->NewDoubleArray(env, 3);
  if (a) (*env)->SetDoubleArrayRegion(env, a, 0, 3, v);
  return a;
}

/* ---- generation ----------------------------------------------------------------------------------------------- */

/* fparams: temperature, top_p, min_p, repetition, presence, frequency penalty (NaN: the package's default);
 * iparams: max_new_tokens, top_k (< 0: default), ignore_eos, keep_context, has_seed, speculate (EL_SPECULATE_*;
 * < 0: default), draft_max (< 0: default); draft: a draft model's context (0: none; draftCheck passed);
 * constraint: the output's automaton (constraintLoad; 0: none). Returns
 * [prompt tokens, generated tokens, finish (EL_FINISH_*), prefill s, decode s, ttft s, decode steps]. */
JNIEXPORT jdoubleArray JNICALL FN(generate)(JNIEnv* env, jclass cls, jlong h, jintArray prompt, jfloatArray fparams,
                                            jintArray iparams, jlong seed, jintArray stop_ids,
                                            jobjectArray stop_strings, jobject listener, jlong draft,
                                            jlong constraint) {
  (void)cls;
  jctx* j = (jctx*)(intptr_t)h;
  el_gen_params p;
  el_gen_params_default(el_context_model(j->c), &p);
  jfloat f[6];
  jint iv[7];
  if ((*env)->GetArrayLength(env, fparams) != 6 || (*env)->GetArrayLength(env, iparams) != 7) {
    throw_error(env, "generate: bad parameter arrays");
    return NULL;
  }
  (*env)->GetFloatArrayRegion(env, fparams, 0, 6, f);
  (*env)->GetIntArrayRegion(env, iparams, 0, 7, iv);
  float* dst[6] = {&p.temperature, &p.top_p, &p.min_p, &p.repetition_penalty, &p.presence_penalty,
                   &p.frequency_penalty};
  for (int i = 0; i < 6; i++)
    if (f[i] == f[i]) *dst[i] = f[i]; /* NaN keeps the default */
  if (iv[0] >= 0) p.max_new_tokens = iv[0];
  if (iv[1] >= 0) p.top_k = iv[1];
  p.ignore_eos = iv[2] != 0;
  p.keep_context = iv[3] != 0;
  if (iv[4]) p.seed = (uint64_t)seed;
  if (iv[5] >= 0) p.speculate = iv[5]; /* el_generate_start checks both */
  if (iv[6] >= 0) p.draft_max = iv[6];
  p.constraint = (const el_constraint*)(intptr_t)constraint;
  if (draft) { /* a draft model drafts in auto mode unless a mode is given */
    p.draft = ((jctx*)(intptr_t)draft)->c;
    if (iv[5] < 0) p.speculate = EL_SPECULATE_AUTO;
  }

  jsize n = (*env)->GetArrayLength(env, prompt);
  int32_t* ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  jsize n_stop = stop_ids ? (*env)->GetArrayLength(env, stop_ids) : 0;
  int32_t* sids = malloc(sizeof(int32_t) * (size_t)(n_stop ? n_stop : 1));
  jsize n_str = stop_strings ? (*env)->GetArrayLength(env, stop_strings) : 0;
  char** strs = calloc((size_t)(n_str ? n_str : 1), sizeof(char*));
  jdoubleArray out = NULL;
  if (!ids || !sids || !strs) {
    throw_error(env, "out of memory");
    goto done;
  }
  (*env)->GetIntArrayRegion(env, prompt, 0, n, (jint*)ids);
  if (n_stop) (*env)->GetIntArrayRegion(env, stop_ids, 0, n_stop, (jint*)sids);
  for (jsize i = 0; i < n_str; i++) {
    jbyteArray b = (jbyteArray)(*env)->GetObjectArrayElement(env, stop_strings, i);
    strs[i] = dup_bytes(env, b);
    (*env)->DeleteLocalRef(env, b);
    if (!strs[i]) {
      throw_error(env, "generate: a null stop string");
      goto done;
    }
  }
  p.n_stop_ids = n_stop, p.stop_ids = sids;
  p.n_stop_strings = n_str, p.stop_strings = (const char* const*)strs;

  jmethodID on_token = NULL;
  if (listener) {
    jclass lc = (*env)->GetObjectClass(env, listener);
    on_token = (*env)->GetMethodID(env, lc, "onToken", "(I[B)Z");
    (*env)->DeleteLocalRef(env, lc);
    if (!on_token) goto done; /* NoSuchMethodError pending */
  }
  atomic_store(&j->cancel, 0);
  if (el_generate_start(j->c, ids, n, &p) != 0) {
    throw_error(env, NULL);
    goto done;
  }
  /* el_generate's loop, stepwise: next() says whether an event carries a new token, which the listener needs. It
   * stops at the next event once cancel() is called (that event is not handed on), when the listener returns false,
   * or when it throws (the exception stays pending and reaches the Kotlin caller). */
  int finish = EL_FINISH_NONE;
  for (;;) {
    el_event ev;
    int r = el_generate_next(j->c, &ev);
    if (r < 0) {
      throw_error(env, NULL);
      goto done;
    }
    if (atomic_load(&j->cancel)) {
      finish = EL_FINISH_CANCELLED;
      break;
    }
    if (on_token && (r == 1 || ev.text_len > 0)) {
      jbyteArray text = byte_array(env, ev.text, ev.text_len);
      if (!text) goto done;
      jboolean go = (*env)->CallBooleanMethod(env, listener, on_token, r == 1 ? ev.token : -1, text);
      (*env)->DeleteLocalRef(env, text); /* one generation makes more local refs than a frame holds */
      if ((*env)->ExceptionCheck(env)) goto done;
      if (!go && !ev.finish && r == 1) {
        finish = EL_FINISH_CANCELLED;
        break;
      }
    }
    if (r == 0 || ev.finish) {
      finish = ev.finish;
      break;
    }
  }
  el_gen_result r;
  memset(&r, 0, sizeof r);
  el_generate_result(j->c, &r);
  if (finish == EL_FINISH_CANCELLED) r.finish = finish;
  if ((*env)->ExceptionCheck(env)) goto done; /* the listener threw: that exception is the result */
  jdouble v[7] = {r.prompt_tokens, r.generated_tokens, r.finish, r.prefill_seconds, r.decode_seconds,
                  r.ttft_seconds, r.decoded_tokens};
  out = (*env)->NewDoubleArray(env, 7);
  if (out) (*env)->SetDoubleArrayRegion(env, out, 0, 7, v);
done:
  for (jsize i = 0; strs && i < n_str; i++) free(strs[i]);
  free(strs), free(sids), free(ids);
  return out;
}

JNIEXPORT jbyteArray JNICALL FN(version)(JNIEnv* env, jclass cls) {
  (void)cls;
  const char* v = el_version();
  return byte_array(env, v, (int)strlen(v));
}
