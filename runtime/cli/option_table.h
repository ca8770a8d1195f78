/* Generated from runtime/python/options.py by python -m edgellm.runtime.python.gen_option_table; do not edit:
 * tests/test_options.py fails when it and the tables differ. bin/edgellm-run's options. */
#ifndef EDGELLM_OPTION_TABLE_H
#define EDGELLM_OPTION_TABLE_H
#include <stddef.h>

#include "../edgellm.h"

enum { EL_OPT_INT, EL_OPT_FLOAT, EL_OPT_BYTES, EL_OPT_STR, EL_OPT_CHOICE, EL_OPT_FLAG, EL_OPT_U64, EL_OPT_BACKEND };

/* choices: "a|b|c" (the field is a string: the chosen name) or "a=N|b=M" (an int32 field: N or M);
 * EL_OPT_BACKEND: "backend.key" (the value is that option's), or NULL (the value is "backend.key=value") */
typedef struct {
  const char* flag;
  const char* short_flag; /* or NULL */
  int kind;
  size_t offset;
  const char* choices;
  double lo, hi; /* EL_OPT_INT / EL_OPT_FLOAT: inclusive range */
} el_cli_option;

/* into el_load_options */
static const el_cli_option EL_LOAD_OPTIONS[] = {
    {"--threads", NULL, EL_OPT_INT, offsetof(el_load_options, n_threads), NULL, 0.0, 256.0},
    {"--digest", NULL, EL_OPT_STR, offsetof(el_load_options, digest), NULL, 0, 0},
    {"--memory-budget", NULL, EL_OPT_BYTES, offsetof(el_load_options, memory_budget), NULL, 0, 0},
    {"--weight-policy", NULL, EL_OPT_CHOICE, offsetof(el_load_options, weight_policy), "auto|resident|window|experts", 0, 0},
    {"--expert-eviction", NULL, EL_OPT_CHOICE, offsetof(el_load_options, expert_eviction), "freq|lru|lfu", 0, 0},
    {"--expert-predict", NULL, EL_OPT_FLAG, offsetof(el_load_options, expert_predict), NULL, 0, 0},
    {"--no-expert-warm", NULL, EL_OPT_FLAG, offsetof(el_load_options, no_expert_warm), NULL, 0, 0},
    {"--storage", NULL, EL_OPT_CHOICE, offsetof(el_load_options, storage), "native|sd|emmc|ufs3|ufs4", 0, 0},
    {"--io-threads", NULL, EL_OPT_INT, offsetof(el_load_options, io_threads), NULL, 1.0, 4.0},
    {"--direct-io", NULL, EL_OPT_FLAG, offsetof(el_load_options, direct_io), NULL, 0, 0},
    {"--huge-pages", NULL, EL_OPT_CHOICE, offsetof(el_load_options, huge_pages), "auto=-1|on=1|off=0", 0, 0},
    {"--ffn-threshold", NULL, EL_OPT_FLOAT, offsetof(el_load_options, ffn_threshold), NULL, 0.0, 1000000.0},
    {"--prefill-backend", NULL, EL_OPT_CHOICE, offsetof(el_load_options, prefill_backend), "auto=0|cpu=1|npu=2", 0, 0},
    {"--npu-soc", NULL, EL_OPT_BACKEND, offsetof(el_load_options, backend_options), "qnn_ort.npu_soc", 0, 0},
    {"--device", NULL, EL_OPT_BACKEND, offsetof(el_load_options, backend_options), "opencl.device", 0, 0},
    {"--backend-option", NULL, EL_OPT_BACKEND, offsetof(el_load_options, backend_options), NULL, 0, 0},
};

/* into el_gen_params (a value given replaces the package's default) */
static const el_cli_option EL_GEN_OPTIONS[] = {
    {"--max-new-tokens", "-n", EL_OPT_INT, offsetof(el_gen_params, max_new_tokens), NULL, 0.0, 2147483647.0},
    {"--temperature", NULL, EL_OPT_FLOAT, offsetof(el_gen_params, temperature), NULL, -1e30, 1e30},
    {"--top-k", NULL, EL_OPT_INT, offsetof(el_gen_params, top_k), NULL, 0.0, 2147483647.0},
    {"--top-p", NULL, EL_OPT_FLOAT, offsetof(el_gen_params, top_p), NULL, -1e30, 1e30},
    {"--min-p", NULL, EL_OPT_FLOAT, offsetof(el_gen_params, min_p), NULL, -1e30, 1e30},
    {"--repetition-penalty", NULL, EL_OPT_FLOAT, offsetof(el_gen_params, repetition_penalty), NULL, -1e30, 1e30},
    {"--presence-penalty", NULL, EL_OPT_FLOAT, offsetof(el_gen_params, presence_penalty), NULL, -1e30, 1e30},
    {"--frequency-penalty", NULL, EL_OPT_FLOAT, offsetof(el_gen_params, frequency_penalty), NULL, -1e30, 1e30},
    {"--seed", NULL, EL_OPT_U64, offsetof(el_gen_params, seed), NULL, 0, 0},
    {"--ignore-eos", NULL, EL_OPT_FLAG, offsetof(el_gen_params, ignore_eos), NULL, 0, 0},
    {"--speculate", NULL, EL_OPT_CHOICE, offsetof(el_gen_params, speculate), "off=0|auto=1|ngram=2|recycle=3", 0, 0},
    {"--draft-max", NULL, EL_OPT_INT, offsetof(el_gen_params, draft_max), NULL, 0.0, 31.0},
    {"--context-shift", NULL, EL_OPT_CHOICE, offsetof(el_gen_params, context_shift), "off=0|on=1", 0, 0},
    {"--shift-sinks", NULL, EL_OPT_INT, offsetof(el_gen_params, shift_sinks), NULL, 0.0, 1024.0},
    {"--shift-tokens", NULL, EL_OPT_INT, offsetof(el_gen_params, shift_tokens), NULL, 0.0, 2147483647.0},
};

#define EL_LOAD_OPTIONS_USAGE \
  "  --threads N           CPU threads of the model's contexts (0: one per CPU) [default: one per CPU]\n" \
  "  --digest sha256:HEX   refuse to run unless the package matches this sha256:... digest (printed by edgellm\n" \
  "                        compile): every file is checked before anything is loaded\n" \
  "  --memory-budget SIZE  memory the model may use, e.g. 600MB: the weights it holds + one context's KV cache and\n" \
  "                        activations; weights beyond it stream from the package every token (600MB = 600*10^6\n" \
  "                        bytes, 600M = 600MiB = 600*2^20) [default: no limit]\n" \
  "  --weight-policy auto|resident|window|experts\n" \
  "                        resident: all weights in memory; window: stream what the budget cannot hold; experts\n" \
  "                        (MoE): all but the experts held, experts cached in the budget; auto: resident when\n" \
  "                        everything fits, else experts for MoE packages, else window\n" \
  "  --expert-eviction freq|lru|lfu\n" \
  "                        --weight-policy experts: which cached expert makes room [default: freq]\n" \
  "  --expert-predict      --weight-policy experts: run the package's guesses of the next layers' experts and read\n" \
  "                        the guessed ones ahead [default: off: on this project's hosts they cost more reads than\n" \
  "                        they save; README \"MoE models bigger than RAM\"]\n" \
  "  --no-expert-warm      --weight-policy experts: start with an empty expert cache [default: filled at load with\n" \
  "                        the experts calibration selected most]\n" \
  "  --storage native|sd|emmc|ufs3|ufs4\n" \
  "                        shape streamed reads like this storage (ufs3/ufs4: modelled from RAM)\n" \
  "  --io-threads N        reader threads for streamed weights [default: 2]\n" \
  "  --direct-io           O_DIRECT reads for streamed weights [default: buffered reads dropped from the page cache\n" \
  "                        behind them]\n" \
  "  --huge-pages auto|on|off\n" \
  "                        resident weights in transparent huge pages: auto (default), on, off (plain mmap;\n" \
  "                        EDGELLM_HUGEPAGES=0/1 sets it for the Python API)\n" \
  "  --ffn-threshold T     --layout bundled packages: skip FFN neuron groups whose estimated output is below this\n" \
  "                        (0: exact) [default: the package's]\n" \
  "  --prefill-backend auto|cpu|npu\n" \
  "                        android-npu / host-npu packages: prefill prompts on the NPU (ONNX Runtime + QNN EP), the\n" \
  "                        CPU, or the NPU when it loads\n" \
  "  --npu-soc SOC         the SoC whose prepared NPU graphs to load (sm8550, sm8650, sm8750; none: the ONNX\n" \
  "                        graphs) [default: this phone's]\n" \
  "  --device D            android-gpu / opencl packages: the OpenCL device, \"P:D\" or part of its name [default:\n" \
  "                        $EDGELLM_OPENCL_DEVICE, else the first GPU]\n" \
  "  --backend-option B.K=V\n" \
  "                        an option of one of the package's backends, as BACKEND.KEY=VALUE (repeatable; e.g.\n" \
  "                        qnn_ort.qnn_backend=/path/libQnnHtp.so; README \"Backends\")\n"

#define EL_GEN_OPTIONS_USAGE \
  "  -n, --max-new-tokens N\n" \
  "                        tokens to generate at most (more than the context holds: to its end)\n" \
  "  --temperature T       0 = greedy [default: the package's generation_config.json if it samples, else 0]\n" \
  "  --top-k K             0 = off [default: the package's]\n" \
  "  --top-p P             1 = off [default: the package's]\n" \
  "  --min-p P             0 = off [default: the package's]\n" \
  "  --repetition-penalty R\n" \
  "                        1 = off; applies when greedy too [default: the package's]\n" \
  "  --presence-penalty P  0 = off [default: the package's]\n" \
  "  --frequency-penalty F\n" \
  "                        0 = off [default: the package's]\n" \
  "  --seed S              sampling seed [default: random]\n" \
  "  --ignore-eos          keep generating past end-of-sequence tokens\n" \
  "  --speculate off|auto|ngram|recycle|DRAFT_PKG\n" \
  "                        speculative decoding: draft tokens from n-grams of the prompt and reply, verify several\n" \
  "                        per pass over the weights (auto: where drafts pay, else plain; ngram: whenever one\n" \
  "                        matches; recycle: every pass, a tree of n-grams and the tokens the model found likeliest\n" \
  "                        after each token before; DRAFT_PKG: a smaller model's package with the same tokenizer\n" \
  "                        guesses where no n-gram matches, as auto) [default: off]\n" \
  "  --draft-max N         drafts per verify pass at most [default: the package's verify width - 1]\n" \
  "  --context-shift off|on\n" \
  "                        when the context is full, keep its first --shift-sinks tokens (attention sinks) and its\n" \
  "                        newest ones, drop --shift-tokens between them, and go on instead of stopping [default:\n" \
  "                        on for chat and serve, off for run]\n" \
  "  --shift-sinks N       context shift: tokens kept at the start [default: 4]\n" \
  "  --shift-tokens N      context shift: tokens dropped per shift [default: half of those after the sinks]\n"

#endif
