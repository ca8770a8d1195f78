/* The C runtime's own output constraint: a byte automaton (a JSON schema or a regular expression compiled on the
 * host: `edgellm schema`, runtime/python/automaton.py, which documents the file) that the generation loop walks
 * each token's bytes through. Front ends that link no grammar engine (bin/edgellm-run, the Android library) use
 * it; the automaton depends on no model, so one file serves every package.
 *
 * Per draw: the tokens whose bytes the automaton takes from its node are allowed (and the end-of-sequence ids where
 * the node accepts); the mask is kept per node (a JSON string's characters come back to the same node token after
 * token), so most draws cost a copy. After the draw the node moves along the token's bytes. Drafts of speculative
 * decoding are walked before their pass: a draft the automaton refuses (and what follows it) gets no row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "el_internal.h"

struct el_constraint {
  uint32_t nodes, classes, start;
  uint8_t cls[256];
  uint8_t* accept;
  int32_t* next; /* [nodes][classes], -1: no way on */
};

static const char MAGIC[8] = {'E', 'L', 'D', 'F', 'A', 0, 0, 1};

EL_API el_constraint* el_constraint_load(const char* path) {
  if (!path) return el_error("el_constraint_load: path is NULL"), NULL;
  FILE* f = fopen(path, "rb");
  if (!f) return el_error("cannot open the constraint %s", path), NULL;
  el_constraint* a = calloc(1, sizeof *a);
  char magic[8];
  uint32_t head[4];
  if (!a || fread(magic, 1, 8, f) != 8 || memcmp(magic, MAGIC, 8) != 0 || fread(head, 4, 4, f) != 4 ||
      fread(a->cls, 1, 256, f) != 256) {
    el_error("%s is not an edgellm automaton (compile one with `edgellm schema`)", path);
    goto bad;
  }
  a->nodes = head[0], a->classes = head[1], a->start = head[2];
  if (a->nodes == 0 || a->nodes > (1u << 20) || a->classes == 0 || a->classes > 256 || a->start >= a->nodes) {
    el_error("%s: a damaged automaton (%u nodes, %u byte classes)", path, a->nodes, a->classes);
    goto bad;
  }
  size_t cells = (size_t)a->nodes * a->classes;
  a->accept = malloc(a->nodes);
  a->next = malloc(sizeof(int32_t) * cells);
  if (!a->accept || !a->next) {
    el_error("out of memory for the constraint %s", path);
    goto bad;
  }
  if (fread(a->accept, 1, a->nodes, f) != a->nodes || fread(a->next, 4, cells, f) != cells || fgetc(f) != EOF) {
    el_error("%s: a truncated or damaged automaton", path);
    goto bad;
  }
  for (int b = 0; b < 256; b++)
    if (a->cls[b] >= a->classes) {
      el_error("%s: a damaged automaton (byte class %u of %u)", path, a->cls[b], a->classes);
      goto bad;
    }
  for (size_t i = 0; i < cells; i++)
    if (a->next[i] < -1 || a->next[i] >= (int32_t)a->nodes) {
      el_error("%s: a damaged automaton (a transition to node %d of %u)", path, a->next[i], a->nodes);
      goto bad;
    }
  fclose(f);
  return a;
bad:
  fclose(f);
  el_constraint_free(a);
  return NULL;
}

EL_API void el_constraint_free(el_constraint* a) {
  if (!a) return;
  free(a->accept);
  free(a->next);
  free(a);
}

/* The node after walking bytes s[0..n) from node (-1: refused). */
static int32_t walk(const el_constraint* a, int32_t node, const uint8_t* s, int n) {
  for (int i = 0; i < n && node >= 0; i++) node = a->next[(size_t)node * a->classes + a->cls[s[i]]];
  return node;
}

/* Each token's bytes (el_token_text), once per generation state: tok_at[id]..tok_at[id + 1] in tok_bytes. */
static int token_table(el_gen* g, const el_model* m) {
  if (g->tok_model == m) return 0;
  uint32_t V = m->h.vocab;
  size_t cap = 8 * (size_t)V + 64, used = 0;
  uint32_t* at = malloc(sizeof(uint32_t) * (V + 1));
  uint8_t* bytes = malloc(cap);
  if (!at || !bytes) goto oom;
  for (uint32_t id = 0; id < V; id++) {
    char buf[256];
    int k = el_token_text(m, (int32_t)id, buf, sizeof buf);
    if (k < 0) k = 0;
    if (k > (int)sizeof buf) k = (int)sizeof buf; /* no token's text is this long */
    if (used + (size_t)k > cap) {
      uint8_t* b = realloc(bytes, cap *= 2);
      if (!b) goto oom;
      bytes = b;
    }
    at[id] = (uint32_t)used;
    memcpy(bytes + used, buf, (size_t)k);
    used += (size_t)k;
  }
  at[V] = (uint32_t)used;
  free(g->tok_at), free(g->tok_bytes);
  g->tok_at = at, g->tok_bytes = bytes, g->tok_model = m;
  return 0;
oom:
  free(at), free(bytes);
  return el_error("out of memory for the constraint's token table");
}

static int32_t walk_token(const el_gen* g, int32_t node, int32_t id) {
  return walk(g->dfa, node, g->tok_bytes + g->tok_at[id], (int)(g->tok_at[id + 1] - g->tok_at[id]));
}

static int is_eos(const el_model* m, int32_t id) {
  for (int i = 0; i < m->h.n_eos; i++)
    if (m->h.eos_ids[i] == id) return 1;
  return 0;
}

/* Whether the automaton allows token id from node: its bytes go on (a token with no text never: it would not move
 * the automaton), or it ends the sequence where the node accepts. */
static int allows(const el_gen* g, const el_model* m, int32_t node, int32_t id) {
  if (is_eos(m, id)) return !g->p.ignore_eos && g->dfa->accept[node];
  if (g->tok_at[id + 1] == g->tok_at[id]) return 0;
  return walk_token(g, node, id) >= 0;
}

int el_constraint_start(el_gen* g, const el_model* m, const el_constraint* a) {
  g->dfa = a;
  if (!a) return 0;
  if (token_table(g, m) != 0) return -1;
  int words = (int)((m->h.vocab + 31) / 32);
  if (!g->mask && !(g->mask = malloc(sizeof(uint32_t) * (size_t)words))) return el_error("out of memory");
  if (!g->dfa_masks && !(g->dfa_masks = malloc(sizeof(uint32_t) * (size_t)words * EL_DFA_MASKS)))
    return el_error("out of memory for the constraint's masks");
  for (int i = 0; i < EL_DFA_MASKS; i++) g->dfa_mask_node[i] = -1;
  g->dfa_node = (int32_t)a->start;
  return 0;
}

/* The next draw's mask (g->mask, mask_on): from the node's cached mask, else computed and cached (slot by node).
 * Returns 1 where the node accepts and nothing may follow (the constrained text is complete), -1 on error. */
int el_constraint_mask(el_gen* g, const el_model* m) {
  const el_constraint* a = g->dfa;
  if (g->dfa_node < 0) return el_error("the output constraint refused the text so far");
  int words = (int)((m->h.vocab + 31) / 32), slot = g->dfa_node % EL_DFA_MASKS;
  uint32_t* cached = g->dfa_masks + (size_t)slot * words;
  if (g->dfa_mask_node[slot] != g->dfa_node) {
    memset(cached, 0, sizeof(uint32_t) * (size_t)words);
    for (uint32_t id = 0; id < m->h.vocab; id++)
      if (allows(g, m, g->dfa_node, (int32_t)id)) cached[id >> 5] |= 1u << (id & 31);
    g->dfa_mask_node[slot] = g->dfa_node;
  }
  int any = 0;
  for (int i = 0; i < words && !any; i++) any = cached[i] != 0;
  if (!any) return a->accept[g->dfa_node] ? 1 : el_error("the output constraint allows no token here");
  memcpy(g->mask, cached, sizeof(uint32_t) * (size_t)words);
  g->mask_on = 1;
  return 0;
}

void el_constraint_advance(el_gen* g, int32_t id) {
  if (g->dfa && g->dfa_node >= 0) g->dfa_node = walk_token(g, g->dfa_node, id);
}

/* el_draft_filter over the automaton: node 0 is the node now (after the token just drawn). */
int el_constraint_drafts(void* user, const int32_t* ids, const int32_t* parents, int n, uint8_t* keep) {
  el_gen* g = user;
  int32_t node[EL_MAX_DRAFT + 1];
  node[0] = g->dfa_node;
  for (int i = 0; i < n; i++) {
    int32_t from = node[parents[i]], id = ids[i];
    int ok = from >= 0 && id >= 0 && id < (int32_t)g->tok_model->h.vocab && !is_eos(g->tok_model, id) &&
             g->tok_at[id + 1] > g->tok_at[id];
    node[i + 1] = ok ? walk_token(g, from, id) : -1;
    keep[i] = node[i + 1] >= 0;
  }
  return 0;
}
