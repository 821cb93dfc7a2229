/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Byte-level BPE from a GGUF's vocabulary and merges (tokenizer.ggml.model
 * "gpt2"): special tokens split out first, then each digit on its own, then
 * GPT-2's pre-tokenization ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 * ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), bytes mapped to printable code points,
 * merges applied by rank.  This is SmolLM2's pre-tokenizer ("smollm").
 */
#ifndef KVQ_RUN_TOKENIZER_H
#define KVQ_RUN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tok tok;

/* The tokenizer of f.  Returns 0 and *ret_tok, -EINVAL (another model than
 * gpt2, missing or inconsistent vocabulary/merges; err says which) or
 * -ENOMEM.  f must outlive the tokenizer. */
int tok_new(const gguf_file *f, tok **ret_tok, char *err, size_t errlen);

/* NULL is fine. */
void tok_free(tok *t);

/* Token ids of text[0..len) (malloc'ed, *ret_n of them).  special: nonzero
 * turns the text of control tokens ("<|im_start|>") into their ids, zero
 * tokenizes it as plain text.  Returns 0, -ENOMEM. */
int tok_encode(const tok *t, const char *text, size_t len, int special, uint32_t **ret_ids, size_t *ret_n);

/* The bytes of token id (its text for control tokens), at most len - 1 of
 * them NUL-terminated in buf.  Returns the full byte count (like snprintf)
 * or -EINVAL for an id beyond the vocabulary. */
int tok_decode(const tok *t, uint32_t id, char *buf, size_t len);

/* Vocabulary size. */
uint32_t tok_vocab(const tok *t);

/* End-of-sequence id (tokenizer.ggml.eos_token_id). */
uint32_t tok_eos(const tok *t);

/* Id of the token whose text is exactly piece, or -ENOENT. */
int tok_find(const tok *t, const char *piece);

#endif
