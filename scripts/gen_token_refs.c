// Reference tokenizations computed by llama.cpp's own tokenizer (libllama, vocabulary-only
// load). Built and run by scripts/gen_token_refs.sh, which turns the plain-text output into
// the JSON files of crates/text/tests/fixtures/tokens/.
//
// Usage: gen_token_refs VOCAB.gguf CORPUS.hex [N_RANDOM [ALL_PIECES]]
//
// CORPUS.hex holds one corpus string per line, hex-encoded (an empty line is the empty
// string). Output on stdout, one record per line, every byte string hex-encoded ("-" when
// empty) and every id list comma-separated ("-" when empty):
//
//   V <n_vocab> <vocab_type>
//   E <i> <add_special> <parse_special> <ids>     llama_tokenize of corpus string i
//   D <i> <remove_special> <unparse_special> <hex> llama_detokenize of the ids of (1, 1)
//   R <k> <ids> <hex00> <hex01> <hex10> <hex11> <retok>
//                                                  random id sequence k: llama_detokenize
//                                                  with (remove_special, unparse_special) =
//                                                  (0,0), (0,1), (1,0), (1,1), then
//                                                  llama_tokenize(hex01, 0, 1), or "!" when
//                                                  hex01 is not valid UTF-8
//   P <id> <hex_plain> <hex_special>               llama_token_to_piece(id, lstrip 0,
//                                                  special 0 / 1) for every id seen above
//                                                  (every id of the vocabulary when
//                                                  ALL_PIECES is 1)
//
// Random sequences are deterministic (splitmix64, fixed seed): sequences 0..9 draw ids
// uniformly from the vocabulary, sequences 10..19 draw each id with probability 1/2 from
// the "odd" tokens (control, user-defined, unknown, unused and byte tokens, and tokens whose
// plain piece is not valid UTF-8 on its own), otherwise uniformly. Sequence k starts with
// BOS when k % 4 is 1 or 3 and ends with EOS when k % 4 is 2 or 3 (where the vocabulary has
// them), for remove_special. N_RANDOM (default 20) changes the number of sequences, the first
// half uniform, the second half biased.

#define _POSIX_C_SOURCE 200809L

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define REF_SEED 0x70CE2EF5EEDBA5E5ULL
#include "ref_rand.h"

#define N_RANDOM_DEFAULT 20
#define MAX_RANDOM_LEN 40

static void die(const char * msg) {
    fprintf(stderr, "gen_token_refs: %s\n", msg);
    exit(1);
}

static void * xmalloc(size_t n) {
    void * p = malloc(n ? n : 1);
    if (!p) {
        die("out of memory");
    }
    return p;
}

static void quiet_log(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static void put_hex(const unsigned char * s, size_t n) {
    if (n == 0) {
        fputs("-", stdout);
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        printf("%02x", s[i]);
    }
}

static void put_ids(const llama_token * ids, int n) {
    if (n == 0) {
        fputs("-", stdout);
        return;
    }
    for (int i = 0; i < n; ++i) {
        printf(i ? ",%d" : "%d", ids[i]);
    }
}

// Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
static bool utf8_valid(const unsigned char * s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + len > n) {
            return false;
        }
        for (size_t k = 1; k < len; ++k) {
            if ((s[i + k] & 0xC0) != 0x80) {
                return false;
            }
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return false;
        }
        i += len;
    }
    return true;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    die("bad hex digit in corpus");
    return 0;
}

// Growable buffers, sized by asking the library first (it returns minus the needed size).
static llama_token * tokenize(const struct llama_vocab * vocab, const char * text, int len,
                              bool add_special, bool parse_special, int * n_out) {
    int cap = len + 16;
    llama_token * ids = xmalloc(sizeof *ids * (size_t) cap);
    int n = llama_tokenize(vocab, text, len, ids, cap, add_special, parse_special);
    if (n < 0) {
        if (n == INT32_MIN) {
            die("llama_tokenize overflow");
        }
        cap = -n;
        free(ids);
        ids = xmalloc(sizeof *ids * (size_t) cap);
        n = llama_tokenize(vocab, text, len, ids, cap, add_special, parse_special);
        if (n < 0) {
            die("llama_tokenize failed twice");
        }
    }
    *n_out = n;
    return ids;
}

static char * detokenize(const struct llama_vocab * vocab, const llama_token * ids, int n,
                         bool remove_special, bool unparse_special, int * len_out) {
    int cap = 64 + 16 * n;
    char * text = xmalloc((size_t) cap);
    int len = llama_detokenize(vocab, ids, n, text, cap, remove_special, unparse_special);
    if (len < 0) {
        cap = -len;
        free(text);
        text = xmalloc((size_t) cap);
        len = llama_detokenize(vocab, ids, n, text, cap, remove_special, unparse_special);
        if (len < 0) {
            die("llama_detokenize failed twice");
        }
    }
    *len_out = len;
    return text;
}

static char * piece(const struct llama_vocab * vocab, llama_token id, bool special, int * len_out) {
    int cap = 64;
    char * buf = xmalloc((size_t) cap);
    int len = llama_token_to_piece(vocab, id, buf, cap, 0, special);
    if (len < 0) {
        cap = -len;
        free(buf);
        buf = xmalloc((size_t) cap);
        len = llama_token_to_piece(vocab, id, buf, cap, 0, special);
        if (len < 0) {
            die("llama_token_to_piece failed twice");
        }
    }
    *len_out = len;
    return buf;
}

int main(int argc, char ** argv) {
    if (argc < 3 || argc > 5) {
        die("usage: gen_token_refs VOCAB.gguf CORPUS.hex [N_RANDOM [ALL_PIECES]]");
    }
    const int n_random = argc >= 4 ? atoi(argv[3]) : N_RANDOM_DEFAULT;
    const bool all_pieces = argc >= 5 && atoi(argv[4]) == 1;
    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mparams = llama_model_default_params();
    mparams.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (!model) {
        die("cannot load the vocabulary");
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    printf("V %d %d\n", n_vocab, (int) llama_vocab_type(vocab));

    bool * seen = calloc((size_t) n_vocab, sizeof *seen);
    if (!seen) {
        die("out of memory");
    }

    FILE * corpus = fopen(argv[2], "r");
    if (!corpus) {
        die("cannot open the corpus");
    }
    char * line = NULL;
    size_t line_cap = 0;
    ssize_t line_len;
    int idx = 0;
    while ((line_len = getline(&line, &line_cap, corpus)) >= 0) {
        while (line_len > 0 && (line[line_len - 1] == '\n' || line[line_len - 1] == '\r')) {
            line[--line_len] = 0;
        }
        if (line_len % 2) {
            die("odd-length hex line in corpus");
        }
        const int len = (int) (line_len / 2);
        char * text = xmalloc((size_t) len + 1);
        for (int i = 0; i < len; ++i) {
            text[i] = (char) (hexval(line[2 * i]) * 16 + hexval(line[2 * i + 1]));
        }
        text[len] = 0;

        llama_token * full = NULL;
        int n_full = 0;
        for (int add = 0; add < 2; ++add) {
            for (int parse = 0; parse < 2; ++parse) {
                int n;
                llama_token * ids = tokenize(vocab, text, len, add, parse, &n);
                printf("E %d %d %d ", idx, add, parse);
                put_ids(ids, n);
                putchar('\n');
                for (int i = 0; i < n; ++i) {
                    seen[ids[i]] = true;
                }
                if (add && parse) {
                    full = ids;
                    n_full = n;
                } else {
                    free(ids);
                }
            }
        }
        for (int rs = 0; rs < 2; ++rs) {
            for (int us = 0; us < 2; ++us) {
                int out_len;
                char * out = detokenize(vocab, full, n_full, rs, us, &out_len);
                printf("D %d %d %d ", idx, rs, us);
                put_hex((const unsigned char *) out, (size_t) out_len);
                putchar('\n');
                free(out);
            }
        }
        free(full);
        free(text);
        idx++;
    }
    free(line);
    fclose(corpus);

    // The "odd" tokens the biased random sequences favour.
    llama_token * odd = xmalloc(sizeof *odd * (size_t) n_vocab);
    int n_odd = 0;
    const int odd_attr = LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED |
                         LLAMA_TOKEN_ATTR_UNKNOWN | LLAMA_TOKEN_ATTR_UNUSED | LLAMA_TOKEN_ATTR_BYTE;
    for (llama_token id = 0; id < n_vocab; ++id) {
        bool is_odd = (llama_vocab_get_attr(vocab, id) & odd_attr) != 0;
        if (!is_odd) {
            int plen;
            char * p = piece(vocab, id, false, &plen);
            is_odd = !utf8_valid((const unsigned char *) p, (size_t) plen);
            free(p);
        }
        if (is_odd) {
            odd[n_odd++] = id;
        }
    }

    for (int k = 0; k < n_random; ++k) {
        const int n = 1 + (int) rnd(MAX_RANDOM_LEN);
        llama_token ids[MAX_RANDOM_LEN];
        for (int i = 0; i < n; ++i) {
            if (k >= n_random / 2 && n_odd > 0 && rnd(2) == 0) {
                ids[i] = odd[rnd((uint32_t) n_odd)];
            } else {
                ids[i] = (llama_token) rnd((uint32_t) n_vocab);
            }
        }
        if (k % 4 % 2 == 1 && llama_vocab_bos(vocab) != LLAMA_TOKEN_NULL) {
            ids[0] = llama_vocab_bos(vocab);
        }
        if (k % 4 >= 2 && llama_vocab_eos(vocab) != LLAMA_TOKEN_NULL) {
            ids[n - 1] = llama_vocab_eos(vocab);
        }
        for (int i = 0; i < n; ++i) {
            seen[ids[i]] = true;
        }
        printf("R %d ", k);
        put_ids(ids, n);
        char * unparse = NULL;
        int len_u = 0;
        for (int rs = 0; rs < 2; ++rs) {
            for (int us = 0; us < 2; ++us) {
                int len;
                char * text = detokenize(vocab, ids, n, rs, us, &len);
                putchar(' ');
                put_hex((const unsigned char *) text, (size_t) len);
                if (!rs && us) {
                    unparse = text;
                    len_u = len;
                } else {
                    free(text);
                }
            }
        }
        putchar(' ');
        if (utf8_valid((const unsigned char *) unparse, (size_t) len_u)) {
            int n_re;
            llama_token * re = tokenize(vocab, unparse, len_u, false, true, &n_re);
            put_ids(re, n_re);
            for (int i = 0; i < n_re; ++i) {
                seen[re[i]] = true;
            }
            free(re);
        } else {
            fputs("!", stdout);
        }
        putchar('\n');
        free(unparse);
    }
    free(odd);

    for (llama_token id = 0; id < n_vocab; ++id) {
        if (!seen[id] && !all_pieces) {
            continue;
        }
        int l0, l1;
        char * p0 = piece(vocab, id, false, &l0);
        char * p1 = piece(vocab, id, true, &l1);
        printf("P %d ", id);
        put_hex((const unsigned char *) p0, (size_t) l0);
        putchar(' ');
        put_hex((const unsigned char *) p1, (size_t) l1);
        putchar('\n');
        free(p0);
        free(p1);
    }
    free(seen);

    llama_model_free(model);
    llama_backend_free();
    return 0;
}
