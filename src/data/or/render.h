/* data/or/render.h — renderers and text gates for OR instances (not exported). */
#ifndef TREX_DATA_OR_RENDER_H
#define TREX_DATA_OR_RENDER_H

#include "family.h"

enum { OR_REP_DP = 0, OR_REP_DT = 1, OR_REP_DPS = 2 };
extern const char *const or_rep_names[3];

/* Problem statement (no answer) in one of the three representations. */
void or_render_problem(const or_inst *in, int rep, or_rng *r, or_sb *b);
/* Sets, parameters, variables, objective, constraints (Markdown with LaTeX-lite). */
void or_render_formulation(const or_inst *in, or_sb *b);
/* The model as one ```lp fenced block. */
void or_render_lp_block(const trex_or_model *m, or_sb *b);
/* Status, objective, non-zero decisions, binding rows, LP relaxation. v must be accepted. */
void or_render_solution(const or_inst *in, const trex_or_verdict *v, or_sb *b);
/* <think> ... </think> with the modelling analysis (no computed claims). */
void or_render_think(const or_inst *in, or_rng *r, or_sb *b);
/* Snaps values within 1e-9 of an integer; prints with %.10g. */
double or_snap(double v);
void or_fmt_value(char *buf, size_t n, double v);
/* Share of the instance's parameter values that occur in text as whole numbers. */
double or_number_coverage(const or_inst *in, const char *text);
/* Gates on the question text: length, coverage 1.0, no leak of z, no template debris. */
trex_or_reject or_text_gates(const or_inst *in, const char *user, double z, char *why, size_t why_len);

#endif
