/* TensorBoard event files (train --tensorboard): CRC32C against published check values; the
 * writer's files read back here independently (TFRecord unframing, both CRCs checked, Events
 * decoded with protobuf-c); no overwrite of an existing file; failing writes reported; and a
 * training run whose events carry exactly the values of its metrics.jsonl and stats.jsonl,
 * resumed into a second event file. tests/test_tensorboard.sh has the CLI and the optional
 * check with the `tensorboard` Python package. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fp8train/io.h"
#include "fp8train/tensorboard.h"
#include "fp8train/train.h"
#include "test.h"
#include "tfevent.pb-c.h"

static char root[256];
static char g_cli[1024]; /* the fp8train binary ("" when absent: its checks are skipped) */

static void fmt(char *buf, size_t len, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t len, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, len, f, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- an independent reader */

typedef struct {
    Fp8tTb__Event **ev;
    int n;
} event_list;

static void events_free(event_list *l) {
    for (int i = 0; i < l->n; i++) fp8t_tb__event__free_unpacked(l->ev[i], NULL);
    free(l->ev);
    l->ev = NULL;
    l->n = 0;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Unframe the records of a buffer, checking both masked CRCs of each, and decode each as an
 * Event. 0 ok; -1 with why. */
static int parse_events(const uint8_t *p, size_t len, event_list *out, char *why, size_t whylen) {
    memset(out, 0, sizeof(*out));
    size_t off = 0;
    while (off < len) {
        if (len - off < 12) {
            fmt(why, whylen, "record at %zu: %zu bytes left, a header needs 12", off, len - off);
            goto fail;
        }
        uint64_t n = (uint64_t)le32(p + off) | (uint64_t)le32(p + off + 4) << 32;
        if (le32(p + off + 8) != fp8t_tfrecord_mask(fp8t_crc32c(p + off, 8))) {
            fmt(why, whylen, "record at %zu: length CRC mismatch", off);
            goto fail;
        }
        if (n > len - off - 12 || len - off - 12 - n < 4) {
            fmt(why, whylen, "record at %zu: length %llu runs past the end", off,
                (unsigned long long)n);
            goto fail;
        }
        const uint8_t *data = p + off + 12;
        if (le32(data + n) != fp8t_tfrecord_mask(fp8t_crc32c(data, (size_t)n))) {
            fmt(why, whylen, "record at %zu: data CRC mismatch", off);
            goto fail;
        }
        Fp8tTb__Event *ev = fp8t_tb__event__unpack(NULL, (size_t)n, data);
        if (!ev) {
            fmt(why, whylen, "record at %zu: not a protobuf Event", off);
            goto fail;
        }
        Fp8tTb__Event **g = realloc(out->ev, (size_t)(out->n + 1) * sizeof(*g));
        if (!g) {
            fp8t_tb__event__free_unpacked(ev, NULL);
            fmt(why, whylen, "out of memory");
            goto fail;
        }
        out->ev = g;
        out->ev[out->n++] = ev;
        off += 12 + (size_t)n + 4;
    }
    return 0;
fail:
    events_free(out);
    return -1;
}

static int read_events(const char *path, event_list *out, char *why, size_t whylen) {
    char *text = NULL, e[512];
    size_t len = 0;
    if (fp8t_read_file(path, &text, &len, e, sizeof(e)) != 0) {
        fmt(why, whylen, "%s", e);
        return -1;
    }
    int rc = parse_events((const uint8_t *)text, len, out, why, whylen);
    free(text);
    return rc;
}

/* 1 and *v = the simple_value of `tag` in a summary event; 0 when the tag is absent. */
static int find_value(const Fp8tTb__Event *ev, const char *tag, float *v) {
    if (ev->what_case != FP8T_TB__EVENT__WHAT_SUMMARY) return 0;
    for (size_t i = 0; i < ev->summary->n_value; i++) {
        const Fp8tTb__Summary__Value *x = ev->summary->value[i];
        if (strcmp(x->tag, tag) == 0 &&
            x->value_case == FP8T_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE) {
            *v = x->simple_value;
            return 1;
        }
    }
    return 0;
}

static const Fp8tTb__Event *event_at(const event_list *l, int64_t step) {
    for (int i = 0; i < l->n; i++)
        if (l->ev[i]->what_case == FP8T_TB__EVENT__WHAT_SUMMARY && l->ev[i]->step == step)
            return l->ev[i];
    return NULL;
}

/* The event files of a directory, sorted by name (as TensorBoard reads them). */
static int list_event_files(const char *dir, char names[][512], int max) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < max)
        if (strstr(de->d_name, "tfevents")) fmt(names[n++], 512, "%s/%s", dir, de->d_name);
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[512];
            memcpy(t, names[j], 512);
            memcpy(names[j], names[j - 1], 512);
            memcpy(names[j - 1], t, 512);
        }
    return n;
}

/* Two events say the same: kind, step, and for summaries the same tags with the same values
 * (NaN = NaN); tokens_per_s and the shadow / drift gaps within 1e-5 relative, as
 * metrics.jsonl prints them with 6 digits. 1 same; 0 with why. */
static int same_event(const Fp8tTb__Event *a, const Fp8tTb__Event *b, char *why, size_t len) {
    if (a->what_case != b->what_case || a->step != b->step) {
        fmt(why, len, "kind %d step %lld vs kind %d step %lld", a->what_case, (long long)a->step,
            b->what_case, (long long)b->step);
        return 0;
    }
    if (a->what_case != FP8T_TB__EVENT__WHAT_SUMMARY) return 1;
    if (a->summary->n_value != b->summary->n_value) {
        fmt(why, len, "step %lld: %zu vs %zu values", (long long)a->step, a->summary->n_value,
            b->summary->n_value);
        return 0;
    }
    for (size_t i = 0; i < a->summary->n_value; i++) {
        const char *tag = a->summary->value[i]->tag;
        float va = a->summary->value[i]->simple_value, vb;
        if (!find_value(b, tag, &vb)) {
            fmt(why, len, "step %lld: %s missing", (long long)a->step, tag);
            return 0;
        }
        int six = !strcmp(tag, "tokens_per_s") || strstr(tag, "_gap") != NULL;
        int ok = (isnan(va) && isnan(vb)) || va == vb ||
                 (six && fabs((double)va - vb) <= 1e-5 * fabs((double)vb));
        if (!ok) {
            fmt(why, len, "step %lld: %s %.9g vs %.9g", (long long)a->step, tag, va, vb);
            return 0;
        }
    }
    return 1;
}

/* `fp8train tensorboard RUN --out DIR`; 0 when it succeeded. */
static int convert(const char *run, const char *dir) {
    char cmd[3200];
    fmt(cmd, sizeof(cmd), "'%s' tensorboard '%s' --out '%s' >/dev/null", g_cli, run, dir);
    return system(cmd);
}

/* ---------------------------------------------------------------- CRC32C */

/* The definition, bit by bit, as a reference for whichever implementation the library has. */
static uint32_t crc32c_ref(const uint8_t *p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = crc & 1u ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

static void test_crc32c_check_values(void) {
    /* the CRC catalogue's check value and RFC 3720 (iSCSI) appendix B.4 */
    T_CHECK(fp8t_crc32c("123456789", 9) == 0xE3069283u, "got %08x", fp8t_crc32c("123456789", 9));
    uint8_t b[32];
    memset(b, 0, sizeof(b));
    T_CHECK(fp8t_crc32c(b, 32) == 0x8A9136AAu, "32 zeros: %08x", fp8t_crc32c(b, 32));
    memset(b, 0xFF, sizeof(b));
    T_CHECK(fp8t_crc32c(b, 32) == 0x62A8AB43u, "32 0xFF: %08x", fp8t_crc32c(b, 32));
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    T_CHECK(fp8t_crc32c(b, 32) == 0x46DD794Eu, "0..31: %08x", fp8t_crc32c(b, 32));
    T_CHECK(fp8t_crc32c(b, 0) == 0, "empty: %08x", fp8t_crc32c(b, 0));
    /* every length and alignment around the 8-byte words of a wide implementation */
    uint8_t r[300];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof(r); i++) r[i] = (uint8_t)((x = x * 1103515245u + 12345u) >> 24);
    int bad = 0;
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= sizeof(r); n++)
            bad += fp8t_crc32c(r + off, n) != crc32c_ref(r + off, n);
    T_CHECK(bad == 0, "%d lengths/offsets differ from the bitwise definition", bad);
    /* the mask: rotate right by 15, add the TFRecord constant */
    T_CHECK(fp8t_tfrecord_mask(0) == 0xA282EAD8u, "mask(0) %08x", fp8t_tfrecord_mask(0));
    T_CHECK(fp8t_tfrecord_mask(0x00008000u) == 0xA282EAD9u, "mask(1<<15) %08x",
            fp8t_tfrecord_mask(0x8000u));
}

/* ---------------------------------------------------------------- the writer */

static void test_writer_roundtrip(void) {
    char dir[512], err[1024] = "", why[256] = "";
    fmt(dir, sizeof(dir), "%s/unit/tb", root); /* parents created */
    const double t0 = (double)time(NULL);
    fp8t_tb_writer *w = fp8t_tb_open(dir, err, sizeof(err));
    T_ASSERT(w, "open: %s", err);
    const char *path = fp8t_tb_path(w);
    char prefix[600];
    fmt(prefix, sizeof(prefix), "%s/events.out.tfevents.", dir);
    T_CHECK(strncmp(path, prefix, strlen(prefix)) == 0, "file name %s", path);
    char host[256] = "";
    gethostname(host, sizeof(host));
    T_CHECK(host[0] && strstr(path + strlen(prefix), host), "host '%s' not in %s", host, path);
    /* nothing queued: no event */
    T_CHECK(fp8t_tb_write_step(w, 3, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(fp8t_tb_add(w, "loss", 2.5) == 0 && fp8t_tb_add(w, "lr", 1e-4) == 0, "add");
    T_CHECK(fp8t_tb_pending(w) == 2, "pending %zu", fp8t_tb_pending(w));
    T_CHECK(fp8t_tb_write_step(w, 0, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(fp8t_tb_pending(w) == 0, "queue not emptied");
    fp8t_tb_add(w, "loss", 2.25);
    fp8t_tb_add(w, "inspect/layer03.fc2.dgrad.grad_output/underflow_pct", 0.125);
    fp8t_tb_add(w, "grad_norm", NAN);
    T_CHECK(fp8t_tb_write_step(w, 7, err, sizeof(err)) == 0, "%s", err);
    fp8t_tb_add(w, "loss", 1e30);
    T_CHECK(fp8t_tb_write_step(w, (int64_t)1 << 40, err, sizeof(err)) == 0, "%s", err);
    char path_copy[1300];
    fmt(path_copy, sizeof(path_copy), "%s", path);
    /* what a live TensorBoard sees: every written step is in the file before the close */
    event_list live;
    T_CHECK(read_events(path_copy, &live, why, sizeof(why)) == 0 && live.n == 4,
            "before close: %d events (%s)", live.n, why);
    events_free(&live);
    T_CHECK(fp8t_tb_close(w, err, sizeof(err)) == 0, "close: %s", err);

    event_list l;
    T_ASSERT(read_events(path_copy, &l, why, sizeof(why)) == 0, "read back: %s", why);
    T_ASSERT(l.n == 4, "%d events, expected the version + 3 steps", l.n);
    T_CHECK(l.ev[0]->what_case == FP8T_TB__EVENT__WHAT_FILE_VERSION &&
                strcmp(l.ev[0]->file_version, "brain.Event:2") == 0,
            "first event not the version");
    for (int i = 0; i < l.n; i++)
        T_CHECK(fabs(l.ev[i]->wall_time - t0) < 120, "wall_time %f vs now %f", l.ev[i]->wall_time,
                t0);
    float v;
    T_CHECK(l.ev[1]->step == 0 && find_value(l.ev[1], "loss", &v) && v == 2.5f, "step 0 loss");
    T_CHECK(find_value(l.ev[1], "lr", &v) && v == 1e-4f, "step 0 lr %g", v);
    T_CHECK(l.ev[2]->step == 7 && l.ev[2]->summary->n_value == 3, "step 7: 3 values");
    T_CHECK(find_value(l.ev[2], "inspect/layer03.fc2.dgrad.grad_output/underflow_pct", &v) &&
                v == 0.125f,
            "inspect tag");
    T_CHECK(find_value(l.ev[2], "grad_norm", &v) && isnan(v), "NaN kept");
    T_CHECK(!find_value(l.ev[2], "lr", &v), "lr of step 0 repeated at step 7");
    T_CHECK(l.ev[3]->step == (int64_t)1 << 40 && find_value(l.ev[3], "loss", &v) && v == 1e30f,
            "64-bit step");
    events_free(&l);
}

/* A second writer in the same directory within the same second gets a new name; the first
 * file stays as it was. */
static void test_no_overwrite(void) {
    char dir[512], err[1024] = "";
    fmt(dir, sizeof(dir), "%s/two", root);
    fp8t_tb_writer *a = fp8t_tb_open(dir, err, sizeof(err));
    T_ASSERT(a, "%s", err);
    fp8t_tb_add(a, "loss", 1.0);
    T_CHECK(fp8t_tb_write_step(a, 1, err, sizeof(err)) == 0, "%s", err);
    struct stat sa0, sa1;
    stat(fp8t_tb_path(a), &sa0);
    fp8t_tb_writer *b = fp8t_tb_open(dir, err, sizeof(err));
    T_ASSERT(b, "%s", err);
    T_CHECK(strcmp(fp8t_tb_path(a), fp8t_tb_path(b)) != 0, "same file %s", fp8t_tb_path(a));
    stat(fp8t_tb_path(a), &sa1);
    T_CHECK(sa0.st_size == sa1.st_size && sa0.st_size > 0, "first file changed: %lld -> %lld",
            (long long)sa0.st_size, (long long)sa1.st_size);
    fp8t_tb_close(a, err, sizeof(err));
    fp8t_tb_close(b, err, sizeof(err));
    char names[4][512];
    T_CHECK(list_event_files(dir, names, 4) == 2, "expected 2 event files");
}

/* The reader really checks what the CRCs cover: a flipped bit in a length or in the data is
 * found (so the round trips above would have caught a wrong CRC in the writer). */
static void test_corruption_detected(void) {
    char dir[512], err[1024] = "", why[256] = "";
    fmt(dir, sizeof(dir), "%s/corrupt", root);
    fp8t_tb_writer *w = fp8t_tb_open(dir, err, sizeof(err));
    T_ASSERT(w, "%s", err);
    fp8t_tb_add(w, "loss", 3.0);
    fp8t_tb_write_step(w, 1, err, sizeof(err));
    char path[1300];
    fmt(path, sizeof(path), "%s", fp8t_tb_path(w));
    fp8t_tb_close(w, err, sizeof(err));
    char *text = NULL;
    size_t len = 0;
    T_ASSERT(fp8t_read_file(path, &text, &len, err, sizeof(err)) == 0, "%s", err);
    event_list l;
    uint8_t *p = (uint8_t *)text;
    T_CHECK(parse_events(p, len, &l, why, sizeof(why)) == 0 && l.n == 2, "intact: %s", why);
    events_free(&l);
    p[len - 6] ^= 0x01; /* inside the last record's data */
    T_CHECK(parse_events(p, len, &l, why, sizeof(why)) != 0 && strstr(why, "data CRC"),
            "data bit flip: %s", why);
    p[len - 6] ^= 0x01;
    p[0] ^= 0x01; /* the first record's length */
    T_CHECK(parse_events(p, len, &l, why, sizeof(why)) != 0 && strstr(why, "length CRC"),
            "length bit flip: %s", why);
    p[0] ^= 0x01;
    T_CHECK(parse_events(p, len - 1, &l, why, sizeof(why)) != 0, "truncated file accepted");
    free(text);
}

/* A failing write (here: the file size limit, as a full disk would) is an error naming the
 * file, and the writer refuses to append after a partial record. */
static void test_write_failure(void) {
    char dir[512], err[1024] = "";
    fmt(dir, sizeof(dir), "%s/full", root);
    fp8t_tb_writer *w = fp8t_tb_open(dir, err, sizeof(err));
    T_ASSERT(w, "%s", err);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN); /* EFBIG instead of a signal */
    lim = old;
    lim.rlim_cur = 4096;
    T_ASSERT(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit: %s", strerror(errno));
    char tag[64];
    for (int i = 0; i < 400; i++) {
        fmt(tag, sizeof(tag), "inspect/layer%02d.fc2.fprop.input/amax", i);
        fp8t_tb_add(w, tag, i);
    }
    int rc = fp8t_tb_write_step(w, 1, err, sizeof(err));
    char err2[1024] = "";
    fp8t_tb_add(w, "loss", 1.0);
    int rc2 = fp8t_tb_write_step(w, 2, err2, sizeof(err2));
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_sig);
    T_CHECK(rc == -1, "a write past the size limit succeeded");
    T_CHECK(strstr(err, fp8t_tb_path(w)) && strstr(err, "File too large"), "err: %s", err);
    T_CHECK(rc2 == -1 && strstr(err2, "earlier write failed"), "second write: %d %s", rc2, err2);
    fp8t_tb_close(w, err, sizeof(err));

    /* a directory that cannot be made */
    char file[512];
    fmt(file, sizeof(file), "%s/a_file", root);
    FILE *f = fopen(file, "w");
    T_ASSERT(f, "cannot create %s", file);
    fclose(f);
    fp8t_tb_writer *bad = fp8t_tb_open(file, err, sizeof(err));
    T_CHECK(!bad && strstr(err, file), "open on a file: %s", err);
    fp8t_tb_close(bad, err, sizeof(err));
}

/* ---------------------------------------------------------------- a training run */

static void small_config(fp8t_train_config *c, const char *name) {
    fp8t_train_config_default(c);
    c->model.n_layer = 2;
    c->model.n_embd = 32;
    c->model.n_head = 2;
    c->model.seq_len = 16;
    c->model.mlp_hidden = 64;
    c->batch = 4;
    c->seq_len = 16;
    c->grad_accum = 2;
    c->steps = 12;
    c->warmup = 3;
    c->lr = 3e-3f;
    c->val_every = 4;
    c->val_batches = 2;
    c->quiet = 1;
    c->seed = 5;
    c->policy.history_len = 16;
    fmt(c->out_dir, sizeof(c->out_dir), "%s/%s", root, name);
    fmt(c->tensorboard, sizeof(c->tensorboard), "%s/%s/tb", root, name);
    snprintf(c->inspect, sizeof(c->inspect), "every=3,layers=1,modules=fc2");
}

/* One JSON object per line of path, in an array (NULL if unreadable). */
static cJSON *read_jsonl(const char *path) {
    char *text = NULL, e[512];
    size_t len;
    if (fp8t_read_file(path, &text, &len, e, sizeof(e)) != 0) return NULL;
    cJSON *arr = cJSON_CreateArray();
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        if (o) cJSON_AddItemToArray(arr, o);
    }
    free(text);
    return arr;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Every metrics.jsonl row is an event of its step with the same values (as the float
 * simple_value holds them); every stats.jsonl value of the sink's statistics is there as
 * inspect/<site>/<stat>. Returns the number of inspect values compared. */
static int check_against_logs(const char *out, const event_list *l, int first_step) {
    char path[600];
    fmt(path, sizeof(path), "%s/metrics.jsonl", out);
    cJSON *metrics = read_jsonl(path);
    fmt(path, sizeof(path), "%s/stats.jsonl", out);
    cJSON *stats = read_jsonl(path);
    int n_inspect = 0;
    if (!metrics || !stats) {
        T_FAIL("cannot read the run's metrics.jsonl / stats.jsonl in %s", out);
        goto done;
    }
    int rows = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, metrics) {
        int step = (int)num(row, "step");
        if (step < first_step) continue;
        rows++;
        const Fp8tTb__Event *ev = event_at(l, step);
        if (!ev) {
            T_FAIL("no event for step %d", step);
            break;
        }
        static const char *keys[] = {"loss", "lr", "grad_norm", "val_loss"};
        for (int k = 0; k < 4; k++) {
            double want = num(row, keys[k]);
            float got;
            int have = find_value(ev, keys[k], &got);
            if (isnan(want))
                T_CHECK(!have, "step %d: %s in the events, not in metrics", step, keys[k]);
            else
                T_CHECK(have && got == (float)want, "step %d %s: event %.9g, metrics %.9g", step,
                        keys[k], have ? got : NAN, want);
        }
        float tps;
        T_CHECK(find_value(ev, "tokens_per_s", &tps) &&
                    fabs(tps - num(row, "tokens_per_s")) <= 1e-5 * num(row, "tokens_per_s"),
                "step %d tokens_per_s", step);
    }
    T_CHECK(rows > 0, "no metrics rows from step %d", first_step);
    static const char *stat_keys[] = {"underflow_pct", "saturation_pct", "sqnr_db", "scale",
                                      "amax"};
    cJSON_ArrayForEach(row, stats) {
        int step = (int)num(row, "step");
        if (step < first_step || num(row, "micro") != 0) continue;
        const Fp8tTb__Event *ev = event_at(l, step);
        if (!ev) {
            T_FAIL("stats.jsonl has step %d, the events do not", step);
            break;
        }
        int layer = (int)num(row, "layer");
        for (int k = 0; k < 5; k++) {
            char tag[256];
            fmt(tag, sizeof(tag), "inspect/layer%02d.%s.%s.%s/%s", layer, str(row, "module"),
                str(row, "gemm"), str(row, "tensor"), stat_keys[k]);
            double want = num(row, stat_keys[k]);
            float got;
            int have = find_value(ev, tag, &got);
            if (!isfinite((float)want)) { /* NaN, or 1e300: the SQNR of an exact image */
                T_CHECK(!have, "step %d %s: non-finite in stats.jsonl, yet in the events", step,
                        tag);
                continue;
            }
            T_CHECK(have && got == (float)want, "step %d %s: event %.9g vs stats %.9g", step, tag,
                    have ? got : NAN, want);
            n_inspect++;
        }
    }
done:
    cJSON_Delete(metrics);
    cJSON_Delete(stats);
    return n_inspect;
}

static void test_train_run(void) {
    fp8t_train_config c;
    small_config(&c, "run");
    c.ckpt_every = 6;
    fp8t_train_result res;
    char err[2048] = "", why[256] = "";
    T_ASSERT(fp8t_train_run(&c, &res, err, sizeof(err)) == 0, "train: %s", err);
    char names[4][512];
    T_ASSERT(list_event_files(c.tensorboard, names, 4) == 1, "expected one event file in %s",
             c.tensorboard);
    event_list l;
    T_ASSERT(read_events(names[0], &l, why, sizeof(why)) == 0, "%s: %s", names[0], why);
    /* the version, the session start at step 1, then one event per step, in order */
    T_ASSERT(l.n == 2 + c.steps, "%d events for %d steps", l.n, c.steps);
    T_CHECK(l.ev[1]->what_case == FP8T_TB__EVENT__WHAT_SESSION_LOG && l.ev[1]->step == 1 &&
                l.ev[1]->session_log->status == FP8T_TB__SESSION_LOG__SESSION_STATUS__START,
            "no session START at step 1");
    for (int i = 2; i < l.n; i++)
        T_CHECK(l.ev[i]->step == i - 1, "event %d has step %lld", i, (long long)l.ev[i]->step);
    int n = check_against_logs(c.out_dir, &l, 1);
    /* steps 3, 6, 9, 12 inspected; fc2 of layer 1: 3 GEMMs x 3 tensors, 6 of them operands */
    T_CHECK(n >= 4 * 6 * 3, "only %d inspect values compared", n);
    float v;
    T_CHECK(!find_value(event_at(&l, 4), "inspect/layer01.fc2.fprop.input/amax", &v) &&
                find_value(event_at(&l, 3), "inspect/layer01.fc2.fprop.input/amax", &v),
            "inspect values at the wrong steps");
    T_CHECK(find_value(event_at(&l, 3), "inspect/layer01.fc2.fprop.output/amax", &v) &&
                !find_value(event_at(&l, 3), "inspect/layer01.fc2.fprop.output/sqnr_db", &v),
            "results: amax only");
    events_free(&l);

    /* resumed into the same directory: a second file, from the step after the checkpoint */
    char ck[600];
    fmt(ck, sizeof(ck), "%s/checkpoints/step_000006", c.out_dir);
    snprintf(c.resume, sizeof(c.resume), "%s", ck);
    T_ASSERT(fp8t_train_run(&c, &res, err, sizeof(err)) == 0, "resume: %s", err);
    T_ASSERT(list_event_files(c.tensorboard, names, 4) == 2, "expected 2 event files");
    /* names sort by time; in the same second the resumed one has the ".1" suffix */
    T_ASSERT(read_events(names[1], &l, why, sizeof(why)) == 0, "%s: %s", names[1], why);
    T_CHECK(l.n == 2 + 6 && l.ev[1]->what_case == FP8T_TB__EVENT__WHAT_SESSION_LOG &&
                l.ev[1]->step == 7 && l.ev[2]->step == 7 && l.ev[7]->step == 12,
            "resumed file: %d events, START at 7 then steps 7..12", l.n);
    check_against_logs(c.out_dir, &l, 7);

    /* `fp8train tensorboard` on the finished run: what the two live files say once TensorBoard
     * has dropped the first take of 7..12 (file 1 below step 7, then file 2), in one file */
    if (!g_cli[0]) {
        events_free(&l);
        return;
    }
    event_list first, conv;
    char conv_dir[600], cnames[2][512];
    fmt(conv_dir, sizeof(conv_dir), "%s/converted", c.out_dir);
    T_ASSERT(read_events(names[0], &first, why, sizeof(why)) == 0, "%s", why);
    T_ASSERT(convert(c.out_dir, conv_dir) == 0, "fp8train tensorboard failed");
    T_ASSERT(list_event_files(conv_dir, cnames, 2) == 1, "no converted file");
    T_ASSERT(read_events(cnames[0], &conv, why, sizeof(why)) == 0, "%s", why);
    const Fp8tTb__Event *want[32];
    int nw = 0;
    for (int i = 1; i < first.n && nw < 32; i++)
        if (first.ev[i]->step < 7) want[nw++] = first.ev[i]; /* START 1, steps 1..6 */
    for (int i = 2; i < l.n && nw < 32; i++) want[nw++] = l.ev[i];
    T_CHECK(conv.n == 1 + nw, "converted: %d events, expected %d", conv.n, 1 + nw);
    for (int i = 0; i < nw && 1 + i < conv.n; i++)
        T_CHECK(same_event(conv.ev[1 + i], want[i], why, sizeof(why)), "converted event %d: %s",
                i + 1, why);
    events_free(&first);
    events_free(&conv);
    events_free(&l);
}

/* A shadow rollback re-runs steps: a session START at the first re-run step, then the re-run
 * steps; the summaries, in file order, are metrics.jsonl's rows in order (re-runs included). */
static void test_train_rollback(void) {
    fp8t_train_config c;
    small_config(&c, "rollback");
    c.inspect[0] = 0;
    c.val_every = 0;
    c.shadow_every = 5;
    c.shadow_threshold = 0; /* every shadow step alarms */
    snprintf(c.shadow_action, sizeof(c.shadow_action), "rollback");
    c.ckpt_every = 3;
    c.keep_ckpts = 0;
    fp8t_train_result res;
    char err[2048] = "", why[256] = "";
    T_ASSERT(fp8t_train_run(&c, &res, err, sizeof(err)) == 0, "train: %s", err);
    char names[4][512], path[600];
    T_ASSERT(list_event_files(c.tensorboard, names, 4) == 1, "expected one event file");
    event_list l;
    T_ASSERT(read_events(names[0], &l, why, sizeof(why)) == 0, "%s", why);
    /* alarm at 5 -> back to checkpoint 3, alarm at 10 -> back to 9 (S: session start) */
    static const int want[] = {-1, 1, 2, 3, 4, 5, -4, 4, 5, 6, 7, 8, 9, 10, -10, 10, 11, 12};
    const int nw = (int)(sizeof(want) / sizeof(want[0]));
    T_ASSERT(l.n == 1 + nw, "%d events, expected %d", l.n, 1 + nw);
    for (int i = 0; i < nw; i++) {
        const Fp8tTb__Event *ev = l.ev[1 + i];
        int start = ev->what_case == FP8T_TB__EVENT__WHAT_SESSION_LOG;
        T_CHECK(start == (want[i] < 0) && ev->step == abs(want[i]),
                "event %d: %s at %lld, "
                "expected %s at %d",
                i + 1, start ? "START" : "summary", (long long)ev->step,
                want[i] < 0 ? "START" : "summary", abs(want[i]));
    }
    fmt(path, sizeof(path), "%s/metrics.jsonl", c.out_dir);
    cJSON *metrics = read_jsonl(path);
    T_ASSERT(metrics, "no %s", path);
    int k = 1;
    const cJSON *row;
    cJSON_ArrayForEach(row, metrics) {
        while (k < l.n && l.ev[k]->what_case != FP8T_TB__EVENT__WHAT_SUMMARY) k++;
        float v;
        T_CHECK(k < l.n && l.ev[k]->step == (int)num(row, "step") &&
                    find_value(l.ev[k], "loss", &v) && v == (float)num(row, "loss"),
                "metrics row of step %d: event %d differs", (int)num(row, "step"), k);
        /* metrics.jsonl prints the gap with 6 significant digits */
        double gap = num(row, "shadow_gap");
        T_CHECK(k < l.n && (isnan(gap) ? !find_value(l.ev[k], "shadow_gap", &v)
                                       : find_value(l.ev[k], "shadow_gap", &v) &&
                                             fabs(v - gap) <= 1e-5 * fabs(gap)),
                "step %d: shadow_gap %.9g vs %.9g", (int)num(row, "step"), v, gap);
        k++;
    }
    cJSON_Delete(metrics);

    /* `fp8train tensorboard` on the finished run: the same events, session starts included */
    if (g_cli[0]) {
        char conv_dir[600], cnames[2][512];
        fmt(conv_dir, sizeof(conv_dir), "%s/converted", c.out_dir);
        event_list conv;
        T_ASSERT(convert(c.out_dir, conv_dir) == 0, "fp8train tensorboard failed");
        T_ASSERT(list_event_files(conv_dir, cnames, 2) == 1, "no converted file");
        T_ASSERT(read_events(cnames[0], &conv, why, sizeof(why)) == 0, "%s", why);
        T_CHECK(conv.n == l.n, "converted: %d events, live %d", conv.n, l.n);
        for (int i = 1; i < l.n && i < conv.n; i++)
            T_CHECK(same_event(conv.ev[i], l.ev[i], why, sizeof(why)), "event %d: %s", i, why);
        events_free(&conv);
    }
    events_free(&l);
}

static void test_train_bad_dir(void) {
    fp8t_train_config c;
    small_config(&c, "bad");
    fmt(c.tensorboard, sizeof(c.tensorboard), "%s/a_file_too", root);
    FILE *f = fopen(c.tensorboard, "w");
    T_ASSERT(f, "cannot create %s", c.tensorboard);
    fclose(f);
    fp8t_train_result res;
    char err[2048] = "";
    T_CHECK(fp8t_train_run(&c, &res, err, sizeof(err)) != 0, "ran with a file as --tensorboard");
    T_CHECK(strstr(err, "--tensorboard") && strstr(err, c.tensorboard) &&
                strstr(err, "not a directory"),
            "err: %s", err);
    struct stat st;
    T_CHECK(stat(c.out_dir, &st) != 0, "%s was created", c.out_dir);
}

int main(int argc, char **argv) {
    (void)argc;
    t_suite = "tensorboard";
    /* the CLI beside this test's build directory (make test sets FP8TRAIN_BIN) */
    const char *bin = getenv("FP8TRAIN_BIN");
    if (bin && *bin) {
        fmt(g_cli, sizeof(g_cli), "%s", bin);
    } else {
        char self[900];
        fmt(self, sizeof(self), "%s", argv[0]);
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
        fmt(g_cli, sizeof(g_cli), "%s/../fp8train", slash ? self : ".");
    }
    if (access(g_cli, X_OK) != 0) {
        printf("  (no fp8train binary at %s: the `fp8train tensorboard` checks are skipped; "
               "make test builds it)\n",
               g_cli);
        g_cli[0] = 0;
    }
    snprintf(root, sizeof(root), "/tmp/fp8t_tensorboard.XXXXXX");
    if (!mkdtemp(root)) {
        printf("FAIL tensorboard: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    T_RUN(test_crc32c_check_values);
    T_RUN(test_writer_roundtrip);
    T_RUN(test_no_overwrite);
    T_RUN(test_corruption_detected);
    T_RUN(test_write_failure);
    T_RUN(test_train_run);
    T_RUN(test_train_rollback);
    T_RUN(test_train_bad_dir);
    fp8t_rmtree(root);
    T_MAIN_END();
}
