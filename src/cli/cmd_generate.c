/* `fp8train generate WEIGHTS`: sample text with the inference model (fp8train/infer.h: weights
 * in the inference precision only, a KV cache; many prompts at once with --prompts / --batch).
 * Byte-level by default (token = byte, the synthetic language and text files). With --tokenizer tokenizer.json (a Hugging Face
 * byte-level BPE; the default when the checkpoint's run trained with one) the prompt is text,
 * encoded after the tokenizer's document token as the training data was, and the output is
 * decoded text. With --tokenizer gpt2_tokenizer.bin (llm.c's file, decoding only) the prompt
 * is given as token ids (--prompt-tokens). Exit status: 0 ok, 2 bad input or usage. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_weights_common.h"
#include "fp8train/backend.h"
#include "fp8train/error.h"
#include "fp8train/eval.h"
#include "fp8train/infer.h"
#include "fp8train/tokenizer.h"
#include "util/fs.h"

#define CMD "generate"

typedef struct {
    const char *prompt, *prompt_tokens, *tokenizer, *device, *prompts;
    int tokens, print_ids, batch, no_cache;
    fp8t_sample_cfg sc;
    fp8t_eval_precision prec;
    cli_infer_opts io;
} generate_opts;

#define F(f) FP8T_OPT_FIELD(generate_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "prompt",
     .arg = "TEXT",
     .type = FP8T_OPT_STR,
     F(prompt),
     .dflt = "a newline, or the tokenizer's document token",
     .help = "the prompt: text through --tokenizer tokenizer.json, else bytes (each byte a "
             "token)"},
    {.name = "prompt-tokens",
     .arg = "IDS",
     .type = FP8T_OPT_STR,
     F(prompt_tokens),
     .dflt = "with an llm.c tokenizer, its end-of-text token",
     .help = "the prompt as token ids, e.g. \"50256,464,2068\" (with an llm.c tokenizer .bin)"},
    {.name = "tokens",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(tokens),
     .lo = 1,
     .hi = 1000000,
     .help = "tokens to generate"},
    {.name = "temperature",
     .arg = "T",
     .type = FP8T_OPT_FLOAT,
     F(sc.temperature),
     .lo = 0,
     .hi = 1e6,
     .help = "0 = greedy"},
    {.name = "top-k",
     .arg = "K",
     .type = FP8T_OPT_INT,
     F(sc.top_k),
     .lo = 0,
     .hi = 1 << 30,
     .help = "sample among the K most likely tokens (0 = all)"},
    {.name = "seed",
     .arg = "S",
     .type = FP8T_OPT_U64,
     F(sc.seed),
     .help = "sampler seed: the same seed gives the same text"},
    {.name = "tokenizer",
     .arg = "FILE",
     .type = FP8T_OPT_STR,
     F(tokenizer),
     .dflt = "the run's --tokenizer",
     .help = "a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama-3, Qwen2) to encode "
             "the prompt and decode the output, or llm.c's gpt2_tokenizer.bin (decoding only)"},
    {.name = "prompts",
     .arg = "FILE",
     .type = FP8T_OPT_STR,
     F(prompts),
     .help = "one prompt per line (text, or token ids \"1,2,3\" with an llm.c tokenizer), "
             "generated as batches of --batch sequences"},
    {.name = "batch",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(batch),
     .lo = 1,
     .hi = 1 << 20,
     .dflt = "the number of prompts, at most 64",
     .help = "sequences per batch; with a single prompt, N samples of it (sample i uses seed "
             "S + i)"},
    {.name = "precision",
     .arg = "P",
     .type = FP8T_OPT_CHOICE,
     F(prec),
     .choices = CLI_EVAL_PRECISIONS,
     .help = "bf16 | fp8 | fp32: the weights are held in this precision only (fp8: E4M3 codes "
             "+ a per-tensor scale; the head in BF16)"},
    CLI_ROW_ACT_SCALE(generate_opts, io,
                      "fp8 activation scales: each input's own amax at every call (current), "
                      "the scales learned in training (delayed: the checkpoint's FP8 state, an "
                      "FP8 export's input_scale), or fixed from the input amaxes of "
                      "--calib-batches batches of --calib-data (calibrated: fixed scales, no "
                      "amax pass, the quantization in the producing op)"),
    CLI_ROW_CALIB_DATA(generate_opts, io, "the run's training data",
                       "calibration text/shards (its training split is used)"),
    CLI_ROW_CALIB_BATCHES(generate_opts, io, "calibration batches of the batch's shape"),
    CLI_ROW_KV_CACHE(generate_opts, io, "bf16; fp32 in fp32; fp8 in fp8",
                     "the KV cache (fp8: E4M3 with a scale per position and head)"),
    CLI_ROW_FP8_HEAD(generate_opts, io,
                     "fp8: the embedding table and the head in E4M3 too (a "
                     "vocabulary that is a multiple of 16)"),
    CLI_ROW_NO_GRAPHS(generate_opts, io,
                      "run every decode op as it is called (CUDA records a "
                      "decode step once and replays it by default)"),
    CLI_ROW_ROWS(generate_opts, io),
    CLI_ROW_MLP_ROWS(generate_opts, io),
    CLI_ROW_PREFETCH_MB(generate_opts, io),
    {.name = "no-cache",
     .type = FP8T_OPT_FLAG,
     F(no_cache),
     .help = "the training model's full-window forward per token (no KV cache, one prompt; the "
             "path before the inference model)"},
    CLI_ROW_RUN_DEVICE(generate_opts),
    {.name = "print-tokens",
     .type = FP8T_OPT_FLAG,
     F(print_ids),
     .help = "also print the generated token ids"},
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "WEIGHTS [options]",
    .about = "Sample a continuation from WEIGHTS (checkpoint, Hugging Face directory or llm.c "
             ".bin).\n",
    .epilog = "A prompt + --tokens longer than the model's seq_len runs --no-cache (a sliding "
              "window).\nWith several sequences each is printed after a line \"--- sample I\".\n"
              "Exit status: 0 ok, 2 bad input or usage.\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 2, /* a second one gets a word on quoting prompts (below) */
    .wrap = CLI_HELP_WRAP,
};

/* "1,2,3" -> ids (malloc'd), count in *n; -1 on a malformed list. */
static int parse_ids(const char *s, int **ids, int *n) {
    *n = 0;
    *ids = malloc((strlen(s) / 2 + 2) * sizeof(int));
    if (!*ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 100000000) return -1;
        (*ids)[(*n)++] = (int)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return *n > 0 ? 0 : -1;
}

/* A Hugging Face tokenizer.json (named *.json, JSON inside, or a model directory holding one)
 * rather than llm.c's .bin? */
static int is_tokenizer_json(const char *path) {
    size_t n = strlen(path);
    if ((n >= 5 && !strcmp(path + n - 5, ".json")) || fp8t_is_dir(path)) return 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\t' || c == '\r') {
    }
    fclose(f);
    return c == '{';
}

/* Print one byte-level token: printable bytes and whitespace as they are, others escaped. */
static void put_byte(int tok) {
    if (tok < 256 && (isprint(tok) || tok == '\n' || tok == '\t'))
        putchar(tok);
    else
        printf("\\x%02x", tok & 0xff);
}

/* One prompt as token ids (ids malloc'd); skip: leading tokens that are not printed (the
 * tokenizer's document token). */
typedef struct {
    int *ids;
    int n, skip;
} prompt_ids;

/* How prompts become tokens: a tokenizer.json (bpe), llm.c's tokenizer file (tk: ids only),
 * or bytes. */
typedef struct {
    fp8t_bpe *bpe;
    const fp8t_tokenizer *tk; /* non-NULL: llm.c's tokenizer */
    int V;
} prompt_coder;

/* text (may be NULL: the default prompt) or an id list ("1,2,3", may be NULL) -> p.
 * 0 ok; -1 after a message. */
static int encode_prompt(const prompt_coder *pc, const char *text, const char *id_list,
                         prompt_ids *p) {
    memset(p, 0, sizeof(*p));
    if (id_list) {
        if (parse_ids(id_list, &p->ids, &p->n) != 0) {
            fprintf(stderr,
                    "fp8train generate: prompt tokens '%s': expected comma-separated "
                    "token ids such as \"464,2068\"\n",
                    id_list);
            return -1;
        }
    } else if (pc->bpe) {
        /* the document token first, as every training document began with it */
        fp8t_tok_ids enc = {0};
        int doc = fp8t_bpe_doc_token(pc->bpe);
        const char *t = text ? text : "";
        if (fp8t_bpe_encode(pc->bpe, t, strlen(t), &enc) != 0) {
            fprintf(stderr, "fp8train generate: out of memory\n");
            free(enc.v);
            return -1;
        }
        p->n = (int)enc.n + (doc >= 0);
        p->ids = malloc((size_t)(p->n > 0 ? p->n : 1) * sizeof(int));
        if (!p->ids) {
            free(enc.v);
            return -1;
        }
        if (doc >= 0) p->ids[0] = doc;
        for (size_t i = 0; i < enc.n; i++) p->ids[i + (doc >= 0)] = enc.v[i];
        free(enc.v);
        p->skip = doc >= 0; /* not part of the text: not printed */
        if (p->n == 0) {
            fprintf(stderr, "fp8train generate: give a --prompt (the tokenizer has no document "
                            "token to start from)\n");
            return -1;
        }
    } else if (pc->tk) { /* llm.c's tokenizer decodes only: start from its end-of-text token */
        p->n = 1;
        p->ids = malloc(sizeof(int));
        if (!p->ids) return -1;
        p->ids[0] = pc->tk->eot;
    } else {
        const char *t = text ? text : "\n";
        p->n = (int)strlen(t);
        p->ids = malloc((size_t)(p->n > 0 ? p->n : 1) * sizeof(int));
        if (!p->ids) return -1;
        for (int i = 0; i < p->n; i++) p->ids[i] = (unsigned char)t[i];
        if (p->n == 0) {
            fprintf(stderr, "fp8train generate: a prompt is empty\n");
            return -1;
        }
    }
    for (int i = 0; i < p->n; i++)
        if (p->ids[i] >= pc->V) {
            fprintf(stderr,
                    "fp8train generate: prompt token %d is outside the model's vocabulary "
                    "(%d)\n",
                    p->ids[i], pc->V);
            return -1;
        }
    return 0;
}

/* The prompts of FILE, one per line (text; token ids with llm.c's tokenizer). Empty lines are
 * skipped. *n prompts into *out (malloc'd). 0 ok; -1 after a message. */
static int read_prompts(const char *path, const prompt_coder *pc, prompt_ids **out, int *n) {
    FILE *f = fopen(path, "rb");
    *out = NULL;
    *n = 0;
    if (!f) {
        fprintf(stderr, "fp8train generate: --prompts %s: cannot open it\n", path);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, have = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (*n == have) {
            have = have ? 2 * have : 16;
            prompt_ids *grown = realloc(*out, (size_t)have * sizeof(prompt_ids));
            if (!grown) {
                rc = -1;
                break;
            }
            *out = grown;
        }
        if (encode_prompt(pc, pc->tk ? NULL : line, pc->tk ? line : NULL, &(*out)[*n]) != 0) {
            free((*out)[*n].ids);
            fprintf(stderr, "fp8train generate: --prompts %s: line %d\n", path, *n + 1);
            rc = -1;
            break;
        }
        (*n)++;
    }
    free(line);
    fclose(f);
    if (rc == 0 && *n == 0) {
        fprintf(stderr, "fp8train generate: --prompts %s holds no prompt\n", path);
        rc = -1;
    }
    return rc;
}

static void print_tokens(const prompt_coder *pc, const int *seq, int n) {
    for (int i = 0; i < n; i++) {
        if (pc->bpe) {
            size_t k;
            const char *piece = fp8t_bpe_piece(pc->bpe, seq[i], &k);
            if (piece)
                fwrite(piece, 1, k, stdout);
            else
                printf("<%d>", seq[i]);
        } else if (pc->tk) {
            if (seq[i] < pc->tk->vocab_size)
                fwrite(pc->tk->piece[seq[i]], 1, (size_t)pc->tk->piece_len[seq[i]], stdout);
            else
                printf("<%d>", seq[i]);
        } else {
            put_byte(seq[i]);
        }
    }
}

int fp8t_cmd_generate(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "generate")) {
        argc--;
        argv++;
    }
    generate_opts o = {.tokens = 64, .sc = {1.0f, 0, 1337}, .prec = FP8T_EVAL_BF16};
    cli_infer_opts_init(&o.io);
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0, st = cli_parse(&SPEC, &o, sizeof(o), argc, argv, pos, &n_pos);
    if (st >= 0) return st;
    const char *weights = pos[0];
    if (n_pos > 1) {
        fprintf(stderr,
                "fp8train generate: one WEIGHTS argument expected, got '%s' and '%s' "
                "(quote a prompt with spaces: --prompt \"...\")\n",
                pos[0], pos[1]);
        return 2;
    }
    const char *prompt = o.prompt, *prompt_tokens = o.prompt_tokens, *tok_path = o.tokenizer,
               *device = o.device, *prompts_file = o.prompts;
    const int n_new = o.tokens, print_ids = o.print_ids;
    int batch = o.batch, no_cache = o.no_cache;
    fp8t_sample_cfg sc = o.sc;
    const fp8t_eval_precision prec = o.prec;
    const cli_infer_opts io = o.io;
    if (!weights) {
        fprintf(stderr, "fp8train generate: which weights? (see fp8train generate --help)\n");
        return 2;
    }
    if (!!prompt + !!prompt_tokens + !!prompts_file > 1) {
        fprintf(stderr, "fp8train generate: give one of --prompt, --prompt-tokens, --prompts\n");
        return 2;
    }
    int tok_json = tok_path && is_tokenizer_json(tok_path);
    if (tok_path && !tok_json && prompt) {
        fprintf(stderr,
                "fp8train generate: with an llm.c tokenizer file (%s) the prompt must be "
                "token ids (--prompt-tokens \"1,2,3\"): that file only decodes; for a text "
                "prompt pass a Hugging Face tokenizer.json as --tokenizer\n",
                tok_path);
        return 2;
    }
    char err[FP8T_ERR_LEN];
    fp8t_weights w;
    fp8t_tokenizer tk;
    memset(&tk, 0, sizeof(tk));
    if (fp8t_weights_load(weights, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train generate: %s\n", err);
        return 2;
    }
    int status = 2, n_prompts = 0, *out = NULL;
    prompt_ids *pr = NULL;
    fp8t_backend *be = NULL;
    fp8t_evaluator *ev = NULL;
    fp8t_infer *im = NULL;
    fp8t_bpe *bpe = NULL;
    cli_run_defaults def;
    cli_run_defaults_from(&w, &def);
    if (!tok_path && def.tokenizer[0] && !prompt_tokens) { /* the run's own tokenizer */
        tok_path = def.tokenizer;
        tok_json = 1;
    }
    if (tok_json) {
        if (!(bpe = fp8t_bpe_load(tok_path, err, sizeof(err)))) {
            fprintf(stderr, "fp8train generate: --tokenizer: %s\n", err);
            goto done;
        }
        if (fp8t_bpe_vocab_size(bpe) != w.model.vocab_size)
            fprintf(stderr,
                    "fp8train generate: note: the tokenizer has %d tokens and the model %d\n",
                    fp8t_bpe_vocab_size(bpe), w.model.vocab_size);
    } else if (tok_path) {
        if (fp8t_tokenizer_read(tok_path, &tk, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train generate: --tokenizer: %s\n", err);
            goto done;
        }
        if (tk.vocab_size != w.model.vocab_size)
            fprintf(stderr,
                    "fp8train generate: note: the tokenizer has %d tokens and the model %d\n",
                    tk.vocab_size, w.model.vocab_size);
    }
    const prompt_coder pc = {bpe, (tok_path && !tok_json) ? &tk : NULL, w.model.vocab_size};
    if (prompts_file) {
        if (read_prompts(prompts_file, &pc, &pr, &n_prompts) != 0) goto done;
    } else {
        const int copies = batch > 0 ? batch : 1; /* --batch N samples of one prompt */
        pr = calloc((size_t)copies, sizeof(prompt_ids));
        if (!pr) goto done;
        if (encode_prompt(&pc, prompt, prompt_tokens, &pr[0]) != 0) {
            n_prompts = 1;
            goto done;
        }
        n_prompts = 1;
        for (; n_prompts < copies; n_prompts++) {
            pr[n_prompts] = pr[0];
            pr[n_prompts].ids = malloc((size_t)pr[0].n * sizeof(int));
            if (!pr[n_prompts].ids) goto done;
            memcpy(pr[n_prompts].ids, pr[0].ids, (size_t)pr[0].n * sizeof(int));
        }
        if (!bpe && !pc.tk && !prompt_tokens && prompt && w.model.vocab_size != 256)
            fprintf(stderr,
                    "fp8train generate: note: a byte-level prompt for a model with vocab "
                    "%d; if it was trained on BPE tokens pass its --tokenizer tokenizer.json\n",
                    w.model.vocab_size);
    }
    int longest = 0;
    for (int i = 0; i < n_prompts; i++) longest = pr[i].n > longest ? pr[i].n : longest;
    /* the cache holds a whole sequence; longer ones slide a window over the training model */
    if (!no_cache && longest + n_new - 1 > w.model.seq_len) {
        if (n_prompts > 1) {
            fprintf(stderr,
                    "fp8train generate: the longest prompt (%d tokens) + --tokens %d do "
                    "not fit the model's seq_len %d; use fewer --tokens\n",
                    longest, n_new, w.model.seq_len);
            goto done;
        }
        fprintf(stderr,
                "fp8train generate: note: %d prompt tokens + %d new exceed seq_len %d: "
                "running without the KV cache (a sliding window)\n",
                longest, n_new, w.model.seq_len);
        no_cache = 1;
    }
    if (no_cache && n_prompts > 1) {
        fprintf(stderr, "fp8train generate: --no-cache generates one sequence; drop --prompts / "
                        "--batch\n");
        goto done;
    }
    if (!device) device = def.device;
    cli_debug_opts dbg;
    if (cli_debug_options("generate", &dbg) != 0) goto done;
    if (!(be = fp8t_backend_create(device, &dbg.backend, err, sizeof(err)))) {
        fprintf(stderr, "fp8train generate: --device %s: %s\n", device, err);
        goto done;
    }
    out = malloc((size_t)n_prompts * n_new * sizeof(int));
    if (!out) goto done;
    if (no_cache) {
        int T = pr[0].n + n_new < w.model.seq_len ? pr[0].n + n_new : w.model.seq_len;
        if (!(ev = fp8t_evaluator_create(be, &w, &dbg.model, 1, T, err, sizeof(err)))) {
            fprintf(stderr, "fp8train generate: %s\n", err);
            goto done;
        }
        if (prec == FP8T_EVAL_FP8 &&
            cli_calibrate_tok(ev, &w, def.data, def.val_data, def.tokenizer, def.seed, 4, 0, err,
                              sizeof(err)) < 0) {
            fprintf(stderr, "fp8train generate: %s\n", err);
            goto done;
        }
        fp8t_evaluator_set_precision(ev, prec);
        if (fp8t_generate(ev, pr[0].ids, pr[0].n, n_new, &sc, out, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train generate: %s\n", err);
            goto done;
        }
    } else {
        const int B = batch > 0 ? (batch < n_prompts ? batch : n_prompts)
                                : (n_prompts < 64 ? n_prompts : 64);
        fp8t_infer_opts mo;
        cli_infer_model_opts(&io, prec, &mo);
        const int Tm = longest + n_new - 1;
        if (!(im = fp8t_infer_create_opts(be, &w, &mo, B, Tm, err, sizeof(err))) ||
            cli_infer_calibrate(im, io.calib_data ? io.calib_data : def.data,
                                io.calib_data ? "" : def.val_data, tok_json ? tok_path : NULL,
                                def.seed, io.calib_batches, B, Tm, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train generate: %s\n", err);
            goto done;
        }
        fp8t_infer_memory mem;
        fp8t_infer_memory_get(im, &mem);
        fprintf(stderr, "generate: %s weights%s%s, KV cache %s (%.1f MB), batch %d, %s%s\n",
                fp8t_eval_precision_name(prec),
                prec != FP8T_EVAL_FP8     ? ""
                : fp8t_infer_fp8_head(im) ? " (E4M3, per-tensor scale; head E4M3), activations "
                                          : " (E4M3, per-tensor scale; head bf16), activations ",
                prec == FP8T_EVAL_FP8 ? fp8t_infer_act_desc(im) : "",
                cli_kv_name(fp8t_infer_kv(im)), (double)mem.kv_cache / 1e6, B, be->name,
                fp8t_infer_graphs(im) ? ", decode steps replayed as a graph" : "");
        int **ids = malloc((size_t)n_prompts * sizeof(int *)),
            *lens = malloc((size_t)n_prompts * sizeof(int));
        if (!ids || !lens) {
            free(ids), free(lens);
            goto done;
        }
        for (int i = 0; i < n_prompts; i++) ids[i] = pr[i].ids, lens[i] = pr[i].n;
        int rc = 0;
        for (int s0 = 0; s0 < n_prompts && rc == 0; s0 += B) { /* sequence i: seed + i */
            const int nb = n_prompts - s0 < B ? n_prompts - s0 : B;
            fp8t_sample_cfg c = sc;
            c.seed = sc.seed + (uint64_t)s0;
            rc = fp8t_infer_generate(im, (const int *const *)(ids + s0), lens + s0, nb, n_new, &c,
                                     out + (size_t)s0 * n_new, err, sizeof(err));
        }
        free(ids), free(lens);
        if (rc != 0) {
            fprintf(stderr, "fp8train generate: %s\n", err);
            goto done;
        }
    }
    for (int i = 0; i < n_prompts; i++) {
        if (n_prompts > 1) printf("--- sample %d\n", i);
        print_tokens(&pc, pr[i].ids + pr[i].skip, pr[i].n - pr[i].skip);
        print_tokens(&pc, out + (size_t)i * n_new, n_new);
        printf("\n");
        if (print_ids) {
            printf("tokens:");
            for (int j = 0; j < n_new; j++)
                printf("%s%d", j ? "," : " ", out[(size_t)i * n_new + j]);
            printf("\n");
        }
    }
    status = 0;
done:
    for (int i = 0; i < n_prompts; i++) free(pr[i].ids);
    free(pr);
    free(out);
    fp8t_tokenizer_free(&tk);
    fp8t_bpe_free(bpe);
    fp8t_infer_destroy(im);
    fp8t_evaluator_destroy(ev);
    fp8t_backend_destroy(be);
    fp8t_weights_free(&w);
    return status;
}
