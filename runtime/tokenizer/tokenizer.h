/* Text <-> token ids without Python: a Hugging Face tokenizer.json reduced to tokenizer.bin
 * (compiler/tokenizer_pack.py writes it) and applied in plain C11 (runtime/tokenizer/tokenizer.c, part of libedgellm).
 *
 * Two families, each reproducing `tokenizers` (Tokenizer.from_file(...).encode(text).ids) exactly:
 *   1. byte-level BPE (GPT-2, Llama-3, Qwen2/3, SmolLM, the edgellm demo models): optional NFC, a pre-tokenizer
 *      regex recognised by its pattern string and run as a hand-written scanner (GPT-2, Llama-3, Qwen2), optional
 *      Digits split, bytes as the BPE alphabet;
 *   2. SentencePiece-style BPE (Llama-2, TinyLlama, Mistral v0.1, Gemma): normalizer Prepend("▁") +
 *      Replace(" ", "▁") or a Metaspace pre-tokenizer, characters as the alphabet, <0xXX> byte fallback, unk fusing.
 * Added tokens (special or not) are cut out of the text first, leftmost-longest, like HF's AddedVocabulary.
 *
 * tokenizer.bin, version 1. Little-endian; every section starts on a 4-byte boundary (zero padding).
 *   header, 64 bytes of u32 (i32 where noted):
 *     0 magic "ELTK"       4 version (1)          8 family (1 byte-level, 2 SentencePiece)
 *    12 pretok (0 none, 1 GPT-2 regex, 2 Llama-3 regex, 3 Qwen2 regex, 4 o200k regex)        16 flags (EL_TOKF_* in tokenizer.c)
 *    20 n_vocab (max id + 1)   24 n_merges    28 n_added    32 unk_id (i32, -1 none)    36 bos_id (i32, -1 none)
 *    40 n_prefix, 44 n_suffix: ids the tokenizer's post-processor puts around the text (at most 16 each)
 *    48 str_bytes   52 added_bytes   56 file_bytes (the whole file)   60 CRC-32 (zlib) of bytes [64, file_bytes)
 *   i32 prefix[n_prefix], i32 suffix[n_suffix]
 *   u32 str_off[n_vocab + 1]    token i = str[str_off[i] .. str_off[i+1]); empty for ids nobody uses
 *                               (byte-level: the token's raw bytes; SentencePiece: its UTF-8 text with "▁")
 *   u8  tok_flags[n_vocab]      1 model-vocabulary key (used for lookups), 2 special, 4 added token
 *   u8  str[str_bytes]
 *   u32 merges[n_merges][4]     {left id, right id, rank, merged id}: the BPE merge table, hashed at load
 *   u32 added[n_added][4]       {id, flags (1 special, 2 normalized, 4 lstrip, 8 rstrip), offset, length},
 *                               sorted by id; the text matched is added_str[offset .. offset+length) (for a
 *                               normalized token: its content after the normalizer)
 *   u8  added_str[added_bytes]
 */
#ifndef EDGELLM_TOKENIZER_H
#define EDGELLM_TOKENIZER_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct el_tokenizer el_tokenizer;

/* Loads tokenizer.bin; NULL with el_last_error() set (one line) if it is missing, truncated or corrupt. */
el_tokenizer* el_tok_load(const char* path);
void el_tok_free(el_tokenizer* t);

/* Encodes len bytes of UTF-8 text (len < 0: NUL-terminated). add_bos < 0: the tokenizer's own default, i.e. what
 * HF encode(text, add_special_tokens=True) adds (BOS for Llama, nothing for GPT-2 and the demo models); 0: no
 * special ids; > 0: el_tok_bos() first (if there is one). Invalid UTF-8 bytes are kept as single bytes.
 * Returns the number of ids the text encodes to, like snprintf: if it is more than cap, only the first cap were
 * written and the call can be repeated with a buffer that large. -1 on error (el_last_error() says why). */
int el_tok_encode(const el_tokenizer* t, const char* text, int len, int add_bos, int32_t* out, int cap);

/* The bytes of token id's text: raw bytes for byte-level tokens (a piece may be part of a UTF-8 sequence, so
 * callers buffer until the text is valid); SentencePiece: "▁" becomes a space and <0xXX> its byte. The leading
 * space of the first token of a SentencePiece text is the caller's to strip (HF's Strip/Metaspace decoder does).
 * Special tokens give their text ("<|endoftext|>"): use el_tok_is_special() to hide them.
 * Returns the length; writes min(length, cap) bytes and a NUL after them if length < cap. -1: id out of range. */
int el_tok_decode(const el_tokenizer* t, int32_t id, char* buf, int cap);

int el_tok_bos(const el_tokenizer* t);      /* -1 if none */
int el_tok_n_vocab(const el_tokenizer* t);
int el_tok_is_special(const el_tokenizer* t, int32_t id);  /* 1 for special added tokens, else 0 */

#ifdef __cplusplus
}
#endif
#endif
