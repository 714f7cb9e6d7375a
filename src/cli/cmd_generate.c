/* `fp8train generate WEIGHTS`: sample text. Byte-level by default (token = byte, the
 * synthetic language and text files). With --tokenizer tokenizer.json (a Hugging Face
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
#include "fp8train/eval.h"
#include "fp8train/tokenizer.h"
#include "util/fs.h"

#define CMD "generate"

static void usage(FILE *f) {
    fprintf(f,
        "usage: fp8train generate WEIGHTS [options]\n"
        "  Sample a continuation from WEIGHTS (checkpoint, Hugging Face directory or llm.c .bin).\n"
        "options:\n"
        "  --prompt TEXT         the prompt: text through --tokenizer tokenizer.json, else bytes\n"
        "                        (each byte a token; default: a newline, or the tokenizer's\n"
        "                        document token)\n"
        "  --prompt-tokens IDS   the prompt as token ids, e.g. \"50256,464,2068\" (with an\n"
        "                        llm.c tokenizer .bin; default there: the end-of-text token)\n"
        "  --tokens N            tokens to generate (default 64)\n"
        "  --temperature T       0 = greedy (default 1.0)\n"
        "  --top-k K             sample among the K most likely tokens (default 0 = all)\n"
        "  --seed S              sampler seed (default 1337): the same seed gives the same text\n"
        "  --tokenizer FILE      a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama-3,\n"
        "                        Qwen2; default: the run's --tokenizer) to encode the prompt and\n"
        "                        decode the output, or llm.c's gpt2_tokenizer.bin (decoding only)\n"
        "  --precision P         bf16 (default) | fp8 | fp32\n"
        "  --device cpu|cuda     backend (default: the run's, else cpu)\n"
        "  --print-tokens        also print the generated token ids\n");
}

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
        if (*p == ',') p++;
        else if (*p) return -1;
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
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\t' || c == '\r') {}
    fclose(f);
    return c == '{';
}

/* Print one byte-level token: printable bytes and whitespace as they are, others escaped. */
static void put_byte(int tok) {
    if (tok < 256 && (isprint(tok) || tok == '\n' || tok == '\t')) putchar(tok);
    else printf("\\x%02x", tok & 0xff);
}

int fp8t_cmd_generate(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "generate")) { argc--; argv++; }
    const char *weights = NULL, *prompt = NULL, *prompt_tokens = NULL, *tok_path = NULL,
               *device = NULL;
    int n_new = 64, print_tokens = 0;
    fp8t_sample_cfg sc = {1.0f, 0, 1337};
    fp8t_eval_precision prec = FP8T_EVAL_BF16;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--print-tokens")) { print_tokens = 1; continue; }
        if (a[0] != '-' || !a[1]) {
            if (weights) {
                fprintf(stderr, "fp8train generate: one WEIGHTS argument expected, got '%s' and "
                        "'%s' (quote a prompt with spaces: --prompt \"...\")\n", weights, a);
                return 2;
            }
            weights = a;
            continue;
        }
        if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
        if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--prompt-tokens")) prompt_tokens = v;
        else if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--tokens")) { if (cli_int(CMD, a, v, 1, 1000000, &n_new)) return 2; }
        else if (!strcmp(a, "--temperature")) { if (cli_float(CMD, a, v, 0, 1e6, &sc.temperature)) return 2; }
        else if (!strcmp(a, "--top-k")) { if (cli_int(CMD, a, v, 0, 1 << 30, &sc.top_k)) return 2; }
        else if (!strcmp(a, "--seed")) { if (cli_u64(CMD, a, v, &sc.seed)) return 2; }
        else if (!strcmp(a, "--precision")) {
            if (fp8t_eval_precision_parse(&prec, v) != 0) {
                fprintf(stderr, "fp8train generate: --precision '%s': expected bf16, fp8 or fp32\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "fp8train generate: unknown option '%s' (see fp8train generate --help)\n", a);
            return 2;
        }
    }
    if (!weights) {
        fprintf(stderr, "fp8train generate: which weights? (see fp8train generate --help)\n");
        return 2;
    }
    if (prompt && prompt_tokens) {
        fprintf(stderr, "fp8train generate: give --prompt or --prompt-tokens, not both\n");
        return 2;
    }
    int tok_json = tok_path && is_tokenizer_json(tok_path);
    if (tok_path && !tok_json && prompt) {
        fprintf(stderr, "fp8train generate: with an llm.c tokenizer file (%s) the prompt must be "
                "token ids (--prompt-tokens \"1,2,3\"): that file only decodes; for a text "
                "prompt pass a Hugging Face tokenizer.json as --tokenizer\n", tok_path);
        return 2;
    }
    char err[2048];
    fp8t_weights w;
    fp8t_tokenizer tk;
    memset(&tk, 0, sizeof(tk));
    if (fp8t_weights_load(weights, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train generate: %s\n", err);
        return 2;
    }
    int status = 2, *ids = NULL, n_ids = 0, *out = NULL, skip_first = 0;
    fp8t_backend *be = NULL;
    fp8t_evaluator *ev = NULL;
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
            fprintf(stderr, "fp8train generate: note: the tokenizer has %d tokens and the model %d\n",
                    fp8t_bpe_vocab_size(bpe), w.model.vocab_size);
    } else if (tok_path) {
        if (fp8t_tokenizer_read(tok_path, &tk, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train generate: --tokenizer: %s\n", err);
            goto done;
        }
        if (tk.vocab_size != w.model.vocab_size)
            fprintf(stderr, "fp8train generate: note: the tokenizer has %d tokens and the model %d\n",
                    tk.vocab_size, w.model.vocab_size);
    }
    if (prompt_tokens) {
        if (parse_ids(prompt_tokens, &ids, &n_ids) != 0) {
            fprintf(stderr, "fp8train generate: --prompt-tokens '%s': expected comma-separated "
                    "token ids such as \"464,2068\"\n", prompt_tokens);
            goto done;
        }
    } else if (bpe) {
        /* the document token first, as every training document began with it */
        fp8t_tok_ids enc = {0};
        int doc = fp8t_bpe_doc_token(bpe);
        const char *p = prompt ? prompt : "";
        if (fp8t_bpe_encode(bpe, p, strlen(p), &enc) != 0) {
            fprintf(stderr, "fp8train generate: out of memory\n");
            free(enc.v);
            goto done;
        }
        n_ids = (int)enc.n + (doc >= 0);
        ids = malloc((size_t)(n_ids > 0 ? n_ids : 1) * sizeof(int));
        if (!ids) {
            free(enc.v);
            goto done;
        }
        if (doc >= 0) ids[0] = doc;
        for (size_t i = 0; i < enc.n; i++) ids[i + (doc >= 0)] = enc.v[i];
        free(enc.v);
        skip_first = doc >= 0; /* not part of the text: not printed */
        if (n_ids == 0) {
            fprintf(stderr, "fp8train generate: give a --prompt (the tokenizer %s has no document "
                    "token to start from)\n", tok_path);
            goto done;
        }
    } else {
        const char *p = prompt ? prompt : "\n";
        if (tok_path) p = NULL;
        n_ids = p ? (int)strlen(p) : 1;
        ids = malloc((size_t)(n_ids > 0 ? n_ids : 1) * sizeof(int));
        if (!ids) goto done;
        if (p) for (int i = 0; i < n_ids; i++) ids[i] = (unsigned char)p[i];
        else ids[0] = tk.eot;
        if (n_ids == 0) {
            fprintf(stderr, "fp8train generate: --prompt is empty\n");
            goto done;
        }
        if (p && w.model.vocab_size != 256)
            fprintf(stderr, "fp8train generate: note: a byte-level prompt for a model with vocab "
                    "%d; if it was trained on BPE tokens pass its --tokenizer tokenizer.json\n",
                    w.model.vocab_size);
    }
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= w.model.vocab_size) {
            fprintf(stderr, "fp8train generate: prompt token %d is outside the model's vocabulary "
                    "(%d)\n", ids[i], w.model.vocab_size);
            goto done;
        }
    if (!device) device = def.device;
    int T = n_ids + n_new < w.model.seq_len ? n_ids + n_new : w.model.seq_len;
    cli_debug_opts dbg;
    if (cli_debug_options("generate", &dbg) != 0) goto done;
    if (!(be = fp8t_backend_create(device, &dbg.backend, err, sizeof(err)))) {
        fprintf(stderr, "fp8train generate: --device %s: %s\n", device, err);
        goto done;
    }
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
    out = malloc((size_t)n_new * sizeof(int));
    if (!out || fp8t_generate(ev, ids, n_ids, n_new, &sc, out, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train generate: %s\n", out ? err : "out of memory");
        goto done;
    }
    for (int pass = 0; pass < 2; pass++) { /* the prompt, then the continuation */
        const int *seq = pass ? out : ids, n = pass ? n_new : n_ids;
        for (int i = pass ? 0 : skip_first; i < n; i++) {
            if (bpe) {
                size_t k;
                const char *piece = fp8t_bpe_piece(bpe, seq[i], &k);
                if (piece) fwrite(piece, 1, k, stdout);
                else printf("<%d>", seq[i]);
            } else if (tok_path) {
                if (seq[i] < tk.vocab_size) fwrite(tk.piece[seq[i]], 1, (size_t)tk.piece_len[seq[i]], stdout);
                else printf("<%d>", seq[i]);
            } else {
                put_byte(seq[i]);
            }
        }
    }
    printf("\n");
    if (print_tokens) {
        printf("tokens:");
        for (int i = 0; i < n_new; i++) printf("%s%d", i ? "," : " ", out[i]);
        printf("\n");
    }
    status = 0;
done:
    free(ids);
    free(out);
    fp8t_tokenizer_free(&tk);
    fp8t_bpe_free(bpe);
    fp8t_evaluator_destroy(ev);
    fp8t_backend_destroy(be);
    fp8t_weights_free(&w);
    return status;
}
