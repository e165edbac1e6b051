/* data/or/families_c.c — problem families: transshipment (min-cost flow), generalized assignment,
 * multi-dimensional knapsack, parallel-machine makespan, portfolio with scenario loss limits,
 * fixed-charge transportation and the travelling salesman (MTZ). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family.h"

/* ---------------- transshipment ---------------- */
typedef struct ts_skin {
    const char *skin, *p_sg, *p_pl, *h_sg, *h_pl, *c_sg, *c_pl, *unit, *money;
} ts_skin;

static const ts_skin ts_skins[] = {
    {"grocery", "farm", "farms", "packing house", "packing houses", "supermarket", "supermarkets", "crates",
     "dollars"},
    {"steel", "mill", "mills", "port", "ports", "fabricator", "fabricators", "tonnes", "euros"},
    {"medical", "manufacturer", "manufacturers", "regional depot", "regional depots", "hospital", "hospitals",
     "cartons", "dollars"},
    {"timber", "sawmill", "sawmills", "rail yard", "rail yards", "builder", "builders", "cubic metres",
     "dollars"},
};

static void build_transshipment(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const ts_skin *sk = &OR_PICK(r, ts_skins);
    in->skin = sk->skin;
    int np = or_tier_n(r, tier, 2, 2, 2, 3, 3, 3), nh = or_tier_n(r, tier, 2, 2, 2, 3, 3, 4),
        nc = or_tier_n(r, tier, 2, 3, 3, 4, 4, 5);
    bool caps = tier >= 1;
    or_set *P = or_add_set(in, "p", "P", sk->p_sg, sk->p_pl, np);
    or_set *H = or_add_set(in, "h", "H", sk->h_sg, sk->h_pl, nh);
    or_set *C = or_add_set(in, "c", "C", sk->c_sg, sk->c_pl, nc);
    or_set_labels(P, r, or_place_names, 14, NULL);
    or_set_labels(H, r, or_place_names + 14, 14, NULL);
    or_set_labels(C, r, or_place_names + 28, or_nplace_names - 28, NULL);
    or_param *s = or_add_param(in, "s", "supply", 1, 0, -1);
    or_param *d = or_add_param(in, "d", "demand", 1, 2, -1);
    or_param *a = or_add_param(in, "a", "cost_in", 2, 0, 1);
    or_param *b = or_add_param(in, "b", "cost_out", 2, 1, 2);
    or_param *u = caps ? or_add_param(in, "u", "capacity_in", 2, 0, 1) : NULL;
    double D = 0;
    for (int c = 0; c < nc; c++)
        D += d->v[c] = 5 * or_rng_int(r, 4, 25);
    double left = ceil(D * (1.1 + 0.3 * or_rng_unif(r)));
    for (int p = 0; p < np; p++) {
        s->v[p] = p == np - 1 ? left : floor(left * (0.7 + 0.6 * or_rng_unif(r)) / (np - p));
        left -= s->v[p];
    }
    for (int p = 0; p < np; p++)
        for (int h = 0; h < nh; h++) {
            OR_P2(a, p, h) = or_rng_int(r, 1, 12);
            if (u) /* each plant can still move 1.5 x its supply through the hubs */
                OR_P2(u, p, h) = 5 * ceil(1.5 * s->v[p] / nh * (0.8 + 0.6 * or_rng_unif(r)) / 5);
        }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nc; c++)
            OR_P2(b, h, c) = or_rng_int(r, 1, 15);
    STRF(s->desc, "supply at %s p (%s)", sk->p_sg, sk->unit);
    STRF(s->header, "supply (%s)", sk->unit);
    STRF(s->sent, "{i} can send at most {v} %s.", sk->unit);
    STRF(s->list_pre, "Supplies are ");
    STRF(s->list_elem, "{v} %s at {i}", sk->unit);
    STRF(d->desc, "demand of %s c (%s)", sk->c_sg, sk->unit);
    STRF(d->header, "demand (%s)", sk->unit);
    STRF(d->sent, "{i} needs exactly {v} %s.", sk->unit);
    STRF(d->list_pre, "Demands are ");
    STRF(d->list_elem, "{v} %s for {i}", sk->unit);
    STRF(a->desc, "cost per unit from %s p to %s h (%s)", sk->p_sg, sk->h_sg, sk->money);
    STRF(a->row_pre, "From {i}, one unit costs ");
    STRF(a->row_elem, "{v} %s to reach {j}", sk->money);
    STRF(b->desc, "cost per unit from %s h to %s c (%s)", sk->h_sg, sk->c_sg, sk->money);
    STRF(b->row_pre, "From {i}, one unit costs ");
    STRF(b->row_elem, "{v} %s to reach {j}", sk->money);
    if (u) {
        STRF(u->desc, "capacity of the link from %s p to %s h (%s)", sk->p_sg, sk->h_sg, sk->unit);
        STRF(u->row_pre, "The links from {i} carry at most ");
        STRF(u->row_elem, "{v} %s to {j}", sk->unit);
    }
    or_add_vfam(in, "x", "p,h", "continuous, >= 0", "amount moved from p to hub h");
    or_add_vfam(in, "y", "h,c", "continuous, >= 0", "amount moved from hub h to c");
    or_add_cfam(in, "supply_cap", true, "\\sum_{h} x_{ph} \\le s_{p} \\quad \\forall p", "no source sends more "
                                                                                        "than it has");
    or_add_cfam(in, "flow_conservation", true, "\\sum_{p} x_{ph} = \\sum_{c} y_{hc} \\quad \\forall h",
                "hubs pass on everything they receive and store nothing");
    or_add_cfam(in, "demand_meet", true, "\\sum_{h} y_{hc} = d_{c} \\quad \\forall c", "every destination gets its "
                                                                                     "demand");
    if (u)
        or_add_cfam(in, "arc_capacity", true, "x_{ph} \\le u_{ph} \\quad \\forall p,h", "inbound links are limited");
    STRF(in->obj_math, "\\min \\sum_{p,h} a_{ph} x_{ph} + \\sum_{h,c} b_{hc} y_{hc}");
    STRF(in->obj_desc, "total transport cost");
    STRF(in->obj_noun, "total transport cost (%s)", sk->money);
    char pl[300], hl[300], cl[300];
    or_join_labels(P, pl, sizeof pl);
    or_join_labels(H, hl, sizeof hl);
    or_join_labels(C, cl, sizeof cl);
    STRF(in->intro, "Goods move from %s (%s) through %s (%s) to %s (%s); there are no direct shipments.", sk->p_pl,
         pl, sk->h_pl, hl, sk->c_pl, cl);
    STRF(in->rules, "Each %s passes on everything it receives, every %s must get exactly its demand, and no %s "
                    "may send more than its supply%s. The planner wants the cheapest flow.",
         sk->h_sg, sk->c_sg, sk->p_sg, u ? "; inbound links have capacities" : "");
    STRF(in->integrality, "Flows may be fractional.");
    STRF(in->ask, "How should goods be routed, and what is the minimum total transport cost?");
    char nm[40], ds[96];
    for (int p = 0; p < np; p++)
        for (int h = 0; h < nh; h++) {
            STRF(nm, "x_%d_%d", p + 1, h + 1);
            STRF(ds, "%s from %s to %s", sk->unit, P->label[p], H->label[h]);
            or_col(in, nm, 0, INFINITY, OR_P2(a, p, h), TREX_OR_CONT, ds);
        }
    int y0 = np * nh;
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nc; c++) {
            STRF(nm, "y_%d_%d", h + 1, c + 1);
            STRF(ds, "%s from %s to %s", sk->unit, H->label[h], C->label[c]);
            or_col(in, nm, 0, INFINITY, OR_P2(b, h, c), TREX_OR_CONT, ds);
        }
    int cols[32];
    double co[32];
    for (int p = 0; p < np; p++) {
        for (int h = 0; h < nh; h++) {
            cols[h] = p * nh + h;
            co[h] = 1;
        }
        STRF(nm, "supply_%d", p + 1);
        STRF(ds, "supply at %s", P->label[p]);
        or_row(in, nm, "supply_cap", nh, cols, co, 'L', s->v[p], ds);
    }
    for (int h = 0; h < nh; h++) {
        int k = 0;
        for (int p = 0; p < np; p++) {
            cols[k] = p * nh + h;
            co[k++] = 1;
        }
        for (int c = 0; c < nc; c++) {
            cols[k] = y0 + h * nc + c;
            co[k++] = -1;
        }
        STRF(nm, "hub_%d", h + 1);
        STRF(ds, "balance at %s", H->label[h]);
        or_row(in, nm, "flow_conservation", k, cols, co, 'E', 0, ds);
    }
    for (int c = 0; c < nc; c++) {
        for (int h = 0; h < nh; h++) {
            cols[h] = y0 + h * nc + c;
            co[h] = 1;
        }
        STRF(nm, "demand_%d", c + 1);
        STRF(ds, "demand of %s", C->label[c]);
        or_row(in, nm, "demand_meet", nh, cols, co, 'E', d->v[c], ds);
    }
    for (int p = 0; u && p < np; p++)
        for (int h = 0; h < nh; h++) {
            int j = p * nh + h;
            double one = 1;
            STRF(nm, "cap_%d_%d", p + 1, h + 1);
            STRF(ds, "link %s to %s", P->label[p], H->label[h]);
            or_row(in, nm, "arc_capacity", 1, &j, &one, 'L', OR_P2(u, p, h), ds);
        }
}

/* ---------------- generalized assignment ---------------- */
typedef struct ga_skin {
    const char *skin, *agent_sg, *agent_pl, *job_sg, *job_pl, *res, *money;
    const char *jobs[12];
} ga_skin;

static const ga_skin ga_skins[] = {
    {"print_shop", "press", "presses", "print job", "print jobs", "press hours", "dollars",
     {"the catalogue", "the flyers", "the menus", "the posters", "the labels", "the brochures", "the calendars",
      "the tickets", "the booklets", "the maps", NULL}},
    {"cloud", "server", "servers", "workload", "workloads", "GB of memory", "cents per hour",
     {"the web tier", "the cache", "the batch job", "the search index", "the queue", "the ML inference",
      "the reporting job", "the backup agent", "the API gateway", "the log shipper", NULL}},
    {"audit", "auditor", "auditors", "engagement", "engagements", "working days", "thousand dollars",
     {"the bank audit", "the retail audit", "the grant audit", "the tax review", "the IT audit",
      "the payroll review", "the museum audit", "the charity audit", "the port audit", NULL}},
    {"dock", "loading dock", "loading docks", "truck", "trucks", "dock minutes", "dollars",
     {"the dairy truck", "the parcel van", "the furniture truck", "the produce truck", "the steel trailer",
      "the paper truck", "the drinks lorry", "the fuel tanker", "the pharmacy van", NULL}},
};

static void build_gap(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const ga_skin *sk = &OR_PICK(r, ga_skins);
    in->skin = sk->skin;
    int na = or_tier_n(r, tier, 2, 3, 3, 3, 3, 4), nj = or_tier_n(r, tier, 4, 5, 6, 7, 8, 9);
    or_set *A = or_add_set(in, "i", "I", sk->agent_sg, sk->agent_pl, na);
    for (int i = 0; i < na; i++)
        snprintf(A->label[i], OR_LABEL, "%c%s %c", sk->agent_sg[0] - 32, sk->agent_sg + 1, 'A' + i);
    or_set *J = or_add_set(in, "j", "J", sk->job_sg, sk->job_pl, nj);
    nj = or_set_from_list(J, r, sk->jobs);
    or_param *c = or_add_param(in, "c", "cost", 2, 0, 1);
    or_param *a = or_add_param(in, "a", "use", 2, 0, 1);
    or_param *b = or_add_param(in, "b", "capacity", 1, 0, -1);
    double load[OR_MAX_MEMBERS] = {0};
    for (int j = 0; j < nj; j++) {
        int cert = or_rng_int(r, 0, na - 1);
        for (int i = 0; i < na; i++) {
            OR_P2(c, i, j) = or_rng_int(r, 5, 40);
            OR_P2(a, i, j) = or_rng_int(r, 2, 15);
        }
        load[cert] += OR_P2(a, cert, j);
    }
    for (int i = 0; i < na; i++)
        b->v[i] = ceil(fmax(load[i], 10) * (1.05 + 0.3 * or_rng_unif(r)));
    STRF(c->desc, "cost of giving %s j to %s i (%s)", sk->job_sg, sk->agent_sg, sk->money);
    STRF(c->row_pre, "On {i}, the cost is ");
    STRF(c->row_elem, "{v} %s for {j}", sk->money);
    STRF(a->desc, "%s that %s j takes on %s i", sk->res, sk->job_sg, sk->agent_sg);
    STRF(a->row_pre, "On {i}, the jobs take ");
    STRF(a->row_elem, "{v} %s for {j}", sk->res);
    STRF(b->desc, "%s available on %s i", sk->res, sk->agent_sg);
    STRF(b->header, "%s available", sk->res);
    STRF(b->sent, "{i} has {v} %s available.", sk->res);
    STRF(b->list_pre, "Available capacity is ");
    STRF(b->list_elem, "{v} %s on {i}", sk->res);
    or_add_vfam(in, "x", "i,j", "binary", "1 if job j goes to agent i");
    or_add_cfam(in, "assign_once", true, "\\sum_{i} x_{ij} = 1 \\quad \\forall j", "every job goes to exactly one "
                                                                                 "agent");
    or_add_cfam(in, "agent_capacity", true, "\\sum_{j} a_{ij} x_{ij} \\le b_{i} \\quad \\forall i",
                "no agent is loaded beyond its capacity");
    STRF(in->obj_math, "\\min \\sum_{i}\\sum_{j} c_{ij} x_{ij}");
    STRF(in->obj_desc, "total assignment cost");
    STRF(in->obj_noun, "total cost (%s)", sk->money);
    char al[300], jl[600];
    or_join_labels(A, al, sizeof al);
    or_join_labels(J, jl, sizeof jl);
    STRF(in->intro, "The %s %s must be spread over the %s %s; cost and %s depend on where each one goes.",
         sk->job_pl, jl, sk->agent_pl, al, sk->res);
    STRF(in->rules, "Each %s goes to exactly one %s and cannot be split, and no %s may exceed its available %s. "
                    "The goal is the cheapest assignment.",
         sk->job_sg, sk->agent_sg, sk->agent_sg, sk->res);
    STRF(in->integrality, "Each assignment is a yes-or-no decision.");
    STRF(in->ask, "Where should each %s go, and what is the minimum total cost?", sk->job_sg);
    char nm[40], ds[96];
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nj; j++) {
            STRF(nm, "x_%d_%d", i + 1, j + 1);
            STRF(ds, "%s on %s", J->label[j], A->label[i]);
            or_col(in, nm, 0, 1, OR_P2(c, i, j), TREX_OR_BIN, ds);
        }
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    for (int j = 0; j < nj; j++) {
        for (int i = 0; i < na; i++) {
            cols[i] = i * nj + j;
            co[i] = 1;
        }
        STRF(nm, "assign_%d", j + 1);
        STRF(ds, "%s placed once", J->label[j]);
        or_row(in, nm, "assign_once", na, cols, co, 'E', 1, ds);
    }
    for (int i = 0; i < na; i++) {
        for (int j = 0; j < nj; j++) {
            cols[j] = i * nj + j;
            co[j] = OR_P2(a, i, j);
        }
        STRF(nm, "cap_%d", i + 1);
        STRF(ds, "capacity of %s", A->label[i]);
        or_row(in, nm, "agent_capacity", nj, cols, co, 'L', b->v[i], ds);
    }
}

/* ---------------- multi-dimensional knapsack ---------------- */
typedef struct mk_skin {
    const char *skin, *who, *item_sg, *item_pl, *value, *vunit;
    const char *items[14];
    const char *res[5];
} mk_skin;

static const mk_skin mk_skins[] = {
    {"satellite", "a satellite team", "instrument", "instruments", "science value", "points",
     {"the spectrometer", "the magnetometer", "the star tracker", "the radar", "the thermal camera",
      "the laser altimeter", "the dust counter", "the radio beacon", "the plasma probe", "the gravimeter", NULL},
     {"kg of mass", "watts of power", "litres of volume", "kbit/s of downlink", NULL}},
    {"festival", "a festival organiser", "act", "acts", "expected attendance", "hundred people",
     {"the jazz trio", "the brass band", "the DJ set", "the choir", "the circus show", "the folk duo",
      "the comedy hour", "the string quartet", "the drum circle", "the puppet show", NULL},
     {"thousand dollars of fees", "stage hours", "crew shifts", "hours of sound check", NULL}},
    {"rnd", "an R&D director", "project", "projects", "strategic score", "points",
     {"the battery cell", "the sensor chip", "the coating", "the drone frame", "the pump redesign",
      "the app rewrite", "the alloy test", "the sealant", "the motor controller", "the filter", NULL},
     {"engineer-months", "thousand euros of lab budget", "prototype slots", "test-bench weeks", NULL}},
};

static void build_multi_knapsack(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MAX;
    const mk_skin *sk = &OR_PICK(r, mk_skins);
    in->skin = sk->skin;
    int n = or_tier_n(r, tier, 4, 5, 6, 8, 8, 10), nk = or_tier_n(r, tier, 2, 2, 2, 3, 3, 4);
    or_set *I = or_add_set(in, "j", "J", sk->item_sg, sk->item_pl, n);
    n = or_set_from_list(I, r, sk->items);
    or_set *K = or_add_set(in, "k", "K", "resource", "resources", nk);
    nk = or_set_from_list(K, r, sk->res);
    or_param *v = or_add_param(in, "v", "value", 1, 0, -1);
    or_param *w = or_add_param(in, "w", "use", 2, 0, 1);
    or_param *W = or_add_param(in, "W", "limit", 1, 1, -1);
    for (int j = 0; j < n; j++) {
        v->v[j] = or_rng_int(r, 10, 90);
        for (int k = 0; k < nk; k++)
            OR_P2(w, j, k) = or_rng_int(r, 1, 30);
    }
    for (int k = 0; k < nk; k++) {
        double s = 0;
        for (int j = 0; j < n; j++)
            s += OR_P2(w, j, k);
        W->v[k] = floor(s * (0.35 + 0.3 * or_rng_unif(r)));
    }
    STRF(v->desc, "%s of %s j (%s)", sk->value, sk->item_sg, sk->vunit);
    STRF(v->header, "%s (%s)", sk->value, sk->vunit);
    STRF(v->sent, "{i} brings a %s of {v} %s.", sk->value, sk->vunit);
    STRF(v->list_pre, "The %s, in %s, is ", sk->value, sk->vunit);
    STRF(v->list_elem, "{v} for {i}");
    STRF(w->desc, "amount of resource k that %s j uses", sk->item_sg);
    STRF(w->row_pre, "{i} needs ");
    STRF(w->row_elem, "{v} {j}");
    STRF(W->desc, "amount of resource k available");
    STRF(W->header, "available");
    STRF(W->sent, "Only {v} {i} are available in total.");
    STRF(W->list_pre, "The limits are ");
    STRF(W->list_elem, "{v} {i}");
    or_add_vfam(in, "y", "j", "binary", "1 if item j is chosen");
    or_add_cfam(in, "capacity", true, "\\sum_{j} w_{jk} y_{j} \\le W_{k} \\quad \\forall k",
                "every resource limit holds at once");
    STRF(in->obj_math, "\\max \\sum_{j} v_{j} y_{j}");
    STRF(in->obj_desc, "total %s", sk->value);
    STRF(in->obj_noun, "total %s (%s)", sk->value, sk->vunit);
    char il[600];
    or_join_labels(I, il, sizeof il);
    STRF(in->intro, "Consider %s selecting among the %s %s.", sk->who, sk->item_pl, il);
    in->intro[0] = 'C';
    STRF(in->rules, "Each %s is either taken or not, and the chosen ones together must respect every resource "
                    "limit. The aim is the largest total %s.",
         sk->item_sg, sk->value);
    STRF(in->integrality, "Every choice is a yes-or-no decision.");
    STRF(in->ask, "Which %s should be selected, and what total %s results?", sk->item_pl, sk->value);
    char nm[40], ds[96];
    for (int j = 0; j < n; j++) {
        STRF(nm, "y_%d", j + 1);
        STRF(ds, "select %s", I->label[j]);
        or_col(in, nm, 0, 1, v->v[j], TREX_OR_BIN, ds);
    }
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    for (int k = 0; k < nk; k++) {
        for (int j = 0; j < n; j++) {
            cols[j] = j;
            co[j] = OR_P2(w, j, k);
        }
        STRF(nm, "limit_%d", k + 1);
        STRF(ds, "limit on %s", K->label[k]);
        or_row(in, nm, "capacity", n, cols, co, 'L', W->v[k], ds);
    }
}

/* ---------------- parallel-machine makespan ---------------- */
typedef struct pm2_skin {
    const char *skin, *mach_sg, *mach_pl, *job_sg, *job_pl, *unit;
} pm2_skin;

static const pm2_skin pmk_skins[] = {
    {"kilns", "kiln", "kilns", "firing batch", "firing batches", "hours"},
    {"render_farm", "render node", "render nodes", "scene", "scenes", "minutes"},
    {"sewing", "sewing line", "sewing lines", "order", "orders", "hours"},
    {"lab", "analyser", "analysers", "sample batch", "sample batches", "minutes"},
};

static void build_makespan(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const pm2_skin *sk = &OR_PICK(r, pmk_skins);
    in->skin = sk->skin;
    int nm_ = or_tier_n(r, tier, 2, 2, 2, 3, 3, 3), nj = or_tier_n(r, tier, 4, 5, 5, 6, 6, 7);
    bool unrelated = tier == 2;
    or_set *M = or_add_set(in, "m", "M", sk->mach_sg, sk->mach_pl, nm_);
    for (int m = 0; m < nm_; m++)
        snprintf(M->label[m], OR_LABEL, "%c%s %c", sk->mach_sg[0] - 32, sk->mach_sg + 1, 'A' + m);
    or_set *J = or_add_set(in, "j", "J", sk->job_sg, sk->job_pl, nj);
    or_set_labels(J, r, or_person_names, or_nperson_names, NULL);
    for (int j = 0; j < nj; j++) { /* "Ada's firing batch" */
        char t[OR_LABEL];
        snprintf(t, sizeof t, "%s", J->label[j]);
        snprintf(J->label[j], OR_LABEL, "%.12s's %.24s", t, sk->job_sg);
    }
    or_param *p = unrelated ? or_add_param(in, "p", "time", 2, 1, 0) : or_add_param(in, "p", "time", 1, 1, -1);
    for (int j = 0; j < nj; j++) {
        int base = or_rng_int(r, 2, 20);
        if (unrelated)
            for (int m = 0; m < nm_; m++)
                OR_P2(p, j, m) = base + or_rng_int(r, -1, 6) > 1 ? base + or_rng_int(r, 0, 6) : base;
        else
            p->v[j] = base;
    }
    if (unrelated) {
        STRF(p->desc, "processing time of %s j on %s m (%s)", sk->job_sg, sk->mach_sg, sk->unit);
        STRF(p->row_pre, "{i} takes ");
        STRF(p->row_elem, "{v} %s on {j}", sk->unit);
    } else {
        STRF(p->desc, "processing time of %s j (%s), the same on every %s", sk->job_sg, sk->unit, sk->mach_sg);
        STRF(p->header, "time (%s)", sk->unit);
        STRF(p->sent, "{i} takes {v} %s.", sk->unit);
        STRF(p->list_pre, "Processing times are ");
        STRF(p->list_elem, "{v} %s for {i}", sk->unit);
    }
    or_add_vfam(in, "x", "j,m", "binary", "1 if job j runs on machine m");
    or_add_vfam(in, "C", "", "continuous, >= 0", "makespan: the time the last machine finishes");
    or_add_cfam(in, "assign_once", true, "\\sum_{m} x_{jm} = 1 \\quad \\forall j", "every job runs on one machine");
    or_add_cfam(in, "makespan_def", true, unrelated ? "\\sum_{j} p_{jm} x_{jm} \\le C \\quad \\forall m"
                                                    : "\\sum_{j} p_{j} x_{jm} \\le C \\quad \\forall m",
                "the makespan is at least every machine's total load");
    STRF(in->obj_math, "\\min C");
    STRF(in->obj_desc, "makespan");
    STRF(in->obj_noun, "makespan (%s)", sk->unit);
    char ml[300], jl[600];
    or_join_labels(M, ml, sizeof ml);
    or_join_labels(J, jl, sizeof jl);
    STRF(in->intro, "A workshop has the %s %s and must process %s.", sk->mach_pl, ml, jl);
    STRF(in->rules, "Each %s runs on exactly one %s without interruption; a %s handles its %s one after another. "
                    "All work starts together, and the goal is to finish everything as early as possible.",
         sk->job_sg, sk->mach_sg, sk->mach_sg, sk->job_pl);
    STRF(in->integrality, "Assignments are yes-or-no decisions.");
    STRF(in->ask, "How should the %s be assigned, and what is the shortest possible makespan?", sk->job_pl);
    char nm[40], ds[96];
    for (int j = 0; j < nj; j++)
        for (int m = 0; m < nm_; m++) {
            STRF(nm, "x_%d_%d", j + 1, m + 1);
            STRF(ds, "%s on %s", J->label[j], M->label[m]);
            or_col(in, nm, 0, 1, 0, TREX_OR_BIN, ds);
        }
    int C = or_col(in, "C", 0, INFINITY, 1, TREX_OR_CONT, "makespan");
    int cols[OR_MAX_MEMBERS + 1];
    double co[OR_MAX_MEMBERS + 1];
    for (int j = 0; j < nj; j++) {
        for (int m = 0; m < nm_; m++) {
            cols[m] = j * nm_ + m;
            co[m] = 1;
        }
        STRF(nm, "assign_%d", j + 1);
        STRF(ds, "%s scheduled once", J->label[j]);
        or_row(in, nm, "assign_once", nm_, cols, co, 'E', 1, ds);
    }
    for (int m = 0; m < nm_; m++) {
        for (int j = 0; j < nj; j++) {
            cols[j] = j * nm_ + m;
            co[j] = unrelated ? OR_P2(p, j, m) : p->v[j];
        }
        cols[nj] = C;
        co[nj] = -1;
        STRF(nm, "load_%d", m + 1);
        STRF(ds, "load of %s", M->label[m]);
        or_row(in, nm, "makespan_def", nj + 1, cols, co, 'L', 0, ds);
    }
}

/* ---------------- portfolio with scenario loss limits ---------------- */
typedef struct pf_skin {
    const char *skin, *who, *asset_sg, *asset_pl, *money;
    const char *assets[10];
} pf_skin;

static const pf_skin pf_skins[] = {
    {"pension", "a pension fund", "fund", "funds", "thousand dollars",
     {"the bond fund", "the equity fund", "the property fund", "the money-market fund", "the emerging-markets fund",
      "the infrastructure fund", "the gold fund", "the green-energy fund", NULL}},
    {"endowment", "a university endowment", "asset class", "asset classes", "million euros",
     {"government bonds", "corporate bonds", "domestic equity", "foreign equity", "real estate", "private credit",
      "commodities", "cash", NULL}},
    {"treasury", "a company treasury", "instrument", "instruments", "thousand pounds",
     {"treasury bills", "term deposits", "commercial paper", "a bond ETF", "a dividend ETF", "an index fund",
      "a money-market account", NULL}},
};

static const char *const scen_names[] = {"recession", "boom", "inflation spike", "rate cut", "flat market",
                                         "currency shock"};

static void build_portfolio(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MAX;
    const pf_skin *sk = &OR_PICK(r, pf_skins);
    in->skin = sk->skin;
    int na = or_tier_n(r, tier, 3, 4, 4, 5, 6, 7), ns = or_tier_n(r, tier, 2, 2, 3, 3, 4, 5);
    or_set *A = or_add_set(in, "j", "J", sk->asset_sg, sk->asset_pl, na);
    na = or_set_from_list(A, r, sk->assets);
    or_set *S = or_add_set(in, "s", "S", "scenario", "scenarios", ns);
    or_set_labels(S, r, scen_names, 6, NULL);
    or_param *mu = or_add_param(in, "mu", "expected_return", 1, 0, -1);
    or_param *ret = or_add_param(in, "r", "scenario_return", 2, 0, 1);
    or_param *cap = or_add_param(in, "u", "max_invest", 1, 0, -1);
    or_param *B = or_add_param(in, "B", "budget", 0, -1, -1);
    or_param *L = or_add_param(in, "L", "max_loss", 0, -1, -1);
    B->v[0] = 100 * or_rng_int(r, 5, 40);
    for (int j = 0; j < na; j++) {
        mu->v[j] = or_round(0.5 + 8 * or_rng_unif(r), 1);
        for (int s = 0; s < ns; s++)
            OR_P2(ret, j, s) = or_round(mu->v[j] + (or_rng_unif(r) - 0.6) * 3 * mu->v[j] - 2, 1);
        cap->v[j] = 10 * ceil(B->v[0] / na * (1.3 + or_rng_unif(r)) / 10);
    }
    /* certificate: the equal split; the loss limit is set so that it holds, but the greedy plan breaks it */
    double worst = 0;
    for (int s = 0; s < ns; s++) {
        double g = 0;
        for (int j = 0; j < na; j++)
            g += OR_P2(ret, j, s) / 100 * B->v[0] / na;
        worst = fmin(worst, g);
    }
    L->v[0] = ceil(-worst * 1.1) + or_rng_int(r, 0, 3);
    STRF(mu->desc, "expected annual return of %s j (percent)", sk->asset_sg);
    STRF(mu->header, "expected return (percent)");
    STRF(mu->sent, "{i} is expected to return {v} percent.");
    STRF(mu->list_pre, "Expected annual returns are ");
    STRF(mu->list_elem, "{v} percent for {i}");
    STRF(ret->desc, "return of %s j in scenario s (percent)", sk->asset_sg);
    STRF(ret->row_pre, "In the stress tests, {i} returns ");
    STRF(ret->row_elem, "{v} percent in a {j}");
    STRF(cap->desc, "most that may go into %s j (%s)", sk->asset_sg, sk->money);
    STRF(cap->header, "maximum (%s)", sk->money);
    STRF(cap->sent, "At most {v} %s may go into {i}.", sk->money);
    STRF(cap->list_pre, "Position limits, in %s, are ", sk->money);
    STRF(cap->list_elem, "{v} for {i}");
    STRF(B->desc, "amount to invest (%s)", sk->money);
    STRF(B->sent, "The whole budget of {v} %s must be invested.", sk->money);
    STRF(L->desc, "largest loss allowed in any scenario (%s)", sk->money);
    STRF(L->sent, "In no stress scenario may the portfolio lose more than {v} %s.", sk->money);
    or_add_vfam(in, "x", "j", "continuous, >= 0", "amount invested in j");
    or_add_cfam(in, "budget", true, "\\sum_{j} x_{j} = B", "the whole budget is invested");
    or_add_cfam(in, "position_limit", true, "x_{j} \\le u_{j} \\quad \\forall j", "concentration limits");
    or_add_cfam(in, "scenario_loss", true, "\\sum_{j} \\frac{r_{js}}{100} x_{j} \\ge -L \\quad \\forall s",
                "the loss in every stress scenario stays within the limit");
    STRF(in->obj_math, "\\max \\sum_{j} \\frac{\\mu_{j}}{100} x_{j}");
    STRF(in->obj_desc, "expected annual return");
    STRF(in->obj_noun, "expected annual return (%s)", sk->money);
    char al[600], sl[300];
    or_join_labels(A, al, sizeof al);
    or_join_labels(S, sl, sizeof sl);
    STRF(in->intro, "Consider %s dividing its budget among %s. Its risk team stress-tests every plan under these "
                    "scenarios: %s.",
         sk->who, al, sl);
    in->intro[0] = 'C';
    STRF(in->rules, "Returns are linear in the amounts invested. Position limits apply, and the loss in each stress "
                    "scenario must stay within the stated limit. The goal is the largest expected return.");
    STRF(in->integrality, "Amounts may be fractional.");
    STRF(in->ask, "How much should go into each %s, and what expected return does the best plan give?",
         sk->asset_sg);
    char nm[40], ds[96];
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    for (int j = 0; j < na; j++) {
        STRF(nm, "x_%d", j + 1);
        STRF(ds, "%s in %s", sk->money, A->label[j]);
        cols[j] = or_col(in, nm, 0, INFINITY, mu->v[j] / 100, TREX_OR_CONT, ds);
        co[j] = 1;
    }
    or_row(in, "budget", "budget", na, cols, co, 'E', B->v[0], "budget");
    for (int j = 0; j < na; j++) {
        double one = 1;
        STRF(nm, "limit_%d", j + 1);
        STRF(ds, "position limit for %s", A->label[j]);
        or_row(in, nm, "position_limit", 1, &j, &one, 'L', cap->v[j], ds);
    }
    for (int s = 0; s < ns; s++) {
        for (int j = 0; j < na; j++) {
            cols[j] = j;
            co[j] = OR_P2(ret, j, s) / 100;
        }
        STRF(nm, "scen_%d", s + 1);
        STRF(ds, "loss limit in a %s", S->label[s]);
        or_row(in, nm, "scenario_loss", na, cols, co, 'G', -L->v[0], ds);
    }
}

/* ---------------- fixed-charge transportation ---------------- */
typedef struct fc_skin {
    const char *skin, *src_sg, *src_pl, *dst_sg, *dst_pl, *unit, *money, *lane;
} fc_skin;

static const fc_skin fc_skins[] = {
    {"barges", "terminal", "terminals", "mill", "mills", "tonnes", "dollars", "barge lane"},
    {"charter", "airport hub", "airport hubs", "resort", "resorts", "passengers", "euros", "charter route"},
    {"fuel", "refinery", "refineries", "fuel depot", "fuel depots", "kilolitres", "dollars", "pipeline lease"},
    {"courier", "sorting centre", "sorting centres", "town", "towns", "parcels (hundreds)", "pounds",
     "van contract"},
};

static void build_fixed_charge(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const fc_skin *sk = &OR_PICK(r, fc_skins);
    in->skin = sk->skin;
    int ns = or_tier_n(r, tier, 2, 2, 2, 3, 3, 3), nd = or_tier_n(r, tier, 2, 3, 3, 4, 4, 5);
    or_set *S = or_add_set(in, "i", "I", sk->src_sg, sk->src_pl, ns);
    or_set *D = or_add_set(in, "j", "J", sk->dst_sg, sk->dst_pl, nd);
    or_set_labels(S, r, or_place_names, 21, NULL);
    or_set_labels(D, r, or_place_names + 21, or_nplace_names - 21, NULL);
    or_param *s = or_add_param(in, "s", "supply", 1, 0, -1);
    or_param *d = or_add_param(in, "d", "demand", 1, 1, -1);
    or_param *c = or_add_param(in, "c", "unit_cost", 2, 0, 1);
    or_param *f = or_add_param(in, "f", "fixed_cost", 2, 0, 1);
    double D0 = 0;
    for (int j = 0; j < nd; j++)
        D0 += d->v[j] = 5 * or_rng_int(r, 4, 20);
    double left = ceil(D0 * (1.1 + 0.3 * or_rng_unif(r)));
    for (int i = 0; i < ns; i++) {
        s->v[i] = i == ns - 1 ? left : floor(left * (0.7 + 0.6 * or_rng_unif(r)) / (ns - i));
        left -= s->v[i];
    }
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < nd; j++) {
            OR_P2(c, i, j) = or_rng_int(r, 2, 12);
            OR_P2(f, i, j) = 10 * or_rng_int(r, 5, 40);
        }
    STRF(s->desc, "supply at %s i (%s)", sk->src_sg, sk->unit);
    STRF(s->header, "supply (%s)", sk->unit);
    STRF(s->sent, "{i} can ship at most {v} %s.", sk->unit);
    STRF(s->list_pre, "Supplies are ");
    STRF(s->list_elem, "{v} %s at {i}", sk->unit);
    STRF(d->desc, "demand of %s j (%s)", sk->dst_sg, sk->unit);
    STRF(d->header, "demand (%s)", sk->unit);
    STRF(d->sent, "{i} needs exactly {v} %s.", sk->unit);
    STRF(d->list_pre, "Demands are ");
    STRF(d->list_elem, "{v} %s for {i}", sk->unit);
    STRF(c->desc, "cost per unit shipped from i to j (%s)", sk->money);
    STRF(c->row_pre, "From {i}, each unit costs ");
    STRF(c->row_elem, "{v} %s to {j}", sk->money);
    STRF(f->desc, "fixed cost of using the %s from i to j (%s)", sk->lane, sk->money);
    STRF(f->row_pre, "Using a %s from {i} costs a fixed ", sk->lane);
    STRF(f->row_elem, "{v} %s to {j}", sk->money);
    or_add_vfam(in, "x", "i,j", "continuous, >= 0", "amount shipped from i to j");
    or_add_vfam(in, "z", "i,j", "binary", "1 if the lane from i to j is used");
    or_add_cfam(in, "supply_cap", true, "\\sum_{j} x_{ij} \\le s_{i} \\quad \\forall i", "sources ship at most "
                                                                                        "their supply");
    or_add_cfam(in, "demand_meet", true, "\\sum_{i} x_{ij} = d_{j} \\quad \\forall j", "demand is met exactly");
    or_add_cfam(in, "arc_open_link", true, "x_{ij} \\le \\min(s_{i}, d_{j})\\, z_{ij} \\quad \\forall i,j",
                "a lane carries goods only if its fixed cost is paid (tight big-M from the data)");
    STRF(in->obj_math, "\\min \\sum_{i,j} (c_{ij} x_{ij} + f_{ij} z_{ij})");
    STRF(in->obj_desc, "variable plus fixed lane costs");
    STRF(in->obj_noun, "total cost (%s)", sk->money);
    char sl[300], dl[300];
    or_join_labels(S, sl, sizeof sl);
    or_join_labels(D, dl, sizeof dl);
    STRF(in->intro, "Goods go from %s (%s) to %s (%s). Every %s used carries a fixed cost on top of the cost per "
                    "unit.",
         sk->src_pl, sl, sk->dst_pl, dl, sk->lane);
    STRF(in->rules, "Each %s must receive exactly its demand and no %s may exceed its supply. The planner wants the "
                    "cheapest plan, counting both the unit costs and the fixed costs of the %ss used.",
         sk->dst_sg, sk->src_sg, sk->lane);
    STRF(in->integrality, "Using a lane is a yes-or-no decision; amounts may be fractional.");
    STRF(in->ask, "Which lanes should be used, how much goes on each, and what is the minimum total cost?");
    char nm[40], ds[96];
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < nd; j++) {
            STRF(nm, "x_%d_%d", i + 1, j + 1);
            STRF(ds, "%s from %s to %s", sk->unit, S->label[i], D->label[j]);
            or_col(in, nm, 0, INFINITY, OR_P2(c, i, j), TREX_OR_CONT, ds);
        }
    int z0 = ns * nd;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < nd; j++) {
            STRF(nm, "z_%d_%d", i + 1, j + 1);
            STRF(ds, "use the lane %s to %s", S->label[i], D->label[j]);
            or_col(in, nm, 0, 1, OR_P2(f, i, j), TREX_OR_BIN, ds);
        }
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    for (int i = 0; i < ns; i++) {
        for (int j = 0; j < nd; j++) {
            cols[j] = i * nd + j;
            co[j] = 1;
        }
        STRF(nm, "supply_%d", i + 1);
        STRF(ds, "supply at %s", S->label[i]);
        or_row(in, nm, "supply_cap", nd, cols, co, 'L', s->v[i], ds);
    }
    for (int j = 0; j < nd; j++) {
        for (int i = 0; i < ns; i++) {
            cols[i] = i * nd + j;
            co[i] = 1;
        }
        STRF(nm, "demand_%d", j + 1);
        STRF(ds, "demand of %s", D->label[j]);
        or_row(in, nm, "demand_meet", ns, cols, co, 'E', d->v[j], ds);
    }
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < nd; j++) {
            int cc[2] = {i * nd + j, z0 + i * nd + j};
            double o[2] = {1, -fmin(s->v[i], d->v[j])};
            STRF(nm, "link_%d_%d", i + 1, j + 1);
            STRF(ds, "lane %s to %s must be paid for", S->label[i], D->label[j]);
            or_row(in, nm, "arc_open_link", 2, cc, o, 'L', 0, ds);
        }
}

/* ---------------- travelling salesman (MTZ) ---------------- */
typedef struct tsp_skin {
    const char *skin, *who, *stop_sg, *stop_pl, *measure, *unit;
} tsp_skin;

static const tsp_skin tsp_skins[] = {
    {"sales", "a sales representative", "client", "clients", "driving distance", "km"},
    {"inspection", "a bridge inspector", "bridge", "bridges", "travel time", "minutes"},
    {"drone", "a survey drone", "waypoint", "waypoints", "flight time", "seconds"},
    {"library", "a mobile-library van", "village", "villages", "driving distance", "km"},
};

static void build_tsp(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const tsp_skin *sk = &OR_PICK(r, tsp_skins);
    in->skin = sk->skin;
    int n = or_tier_n(r, tier, 4, 4, 5, 5, 6, 7);
    or_set *N = or_add_set(in, "i", "N", "stop", "stops", n);
    or_set_labels(N, r, or_place_names, or_nplace_names, NULL);
    or_add_set(in, "j", "N", "stop", "stops", n);
    memcpy(in->sets[1].label, N->label, sizeof N->label);
    or_param *d = or_add_param(in, "d", "distance", 2, 0, 1);
    d->sparse = true;
    double xy[OR_MAX_MEMBERS][2];
    for (int i = 0; i < n; i++) {
        xy[i][0] = or_rng_int(r, 0, 60);
        xy[i][1] = or_rng_int(r, 0, 60);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            OR_P2(d, i, j) = i == j ? NAN : 1 + nearbyint(hypot(xy[i][0] - xy[j][0], xy[i][1] - xy[j][1]));
    const char *home = N->label[0];
    STRF(d->desc, "%s from stop i to stop j (%s)", sk->measure, sk->unit);
    STRF(d->row_pre, "From {i}, the %s is ", sk->measure);
    STRF(d->row_elem, "{v} %s to {j}", sk->unit);
    or_add_vfam(in, "x", "i,j", "binary", "1 if the tour goes directly from i to j");
    or_add_vfam(in, "u", "i", "continuous, 1 <= u <= n-1", "position of stop i in the tour (MTZ order variable)");
    or_add_cfam(in, "degree_out", true, "\\sum_{j \\ne i} x_{ij} = 1 \\quad \\forall i", "leave every stop once");
    or_add_cfam(in, "degree_in", true, "\\sum_{i \\ne j} x_{ij} = 1 \\quad \\forall j", "enter every stop once");
    or_add_cfam(in, "subtour_elim", true,
                "u_{i} - u_{j} + (n-1) x_{ij} \\le n-2 \\quad \\forall i \\ne j,\\ i,j \\ne 1",
                "Miller-Tucker-Zemlin ordering: no closed loop avoids the start");
    STRF(in->obj_math, "\\min \\sum_{i \\ne j} d_{ij} x_{ij}");
    STRF(in->obj_desc, "total %s of the tour", sk->measure);
    STRF(in->obj_noun, "total %s (%s)", sk->measure, sk->unit);
    char nl[400];
    or_join_labels(N, nl, sizeof nl);
    STRF(in->intro, "Consider %s who starts at %s and must visit every %s on the list (%s) exactly once before "
                    "returning to %s.",
         sk->who, home, sk->stop_sg, nl, home);
    in->intro[0] = 'C';
    STRF(in->rules, "The round trip has to be a single tour, with no separate loops. The goal is the smallest total "
                    "%s.",
         sk->measure);
    STRF(in->integrality, "Each leg of the tour is a yes-or-no decision.");
    STRF(in->ask, "In which order should the stops be visited, and what is the shortest total %s?", sk->measure);
    char nm[40], ds[96];
    int idx[OR_MAX_MEMBERS][OR_MAX_MEMBERS];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            idx[i][j] = -1;
            if (i == j)
                continue;
            STRF(nm, "x_%d_%d", i + 1, j + 1);
            STRF(ds, "travel %s to %s", N->label[i], N->label[j]);
            idx[i][j] = or_col(in, nm, 0, 1, OR_P2(d, i, j), TREX_OR_BIN, ds);
        }
    int u[OR_MAX_MEMBERS];
    for (int i = 1; i < n; i++) {
        STRF(nm, "u_%d", i + 1);
        STRF(ds, "position of %s", N->label[i]);
        u[i] = or_col(in, nm, 1, n - 1, 0, TREX_OR_CONT, ds);
    }
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            int k = 0;
            for (int j = 0; j < n; j++)
                if (j != i) {
                    cols[k] = pass ? idx[j][i] : idx[i][j];
                    co[k++] = 1;
                }
            STRF(nm, "%s_%d", pass ? "in" : "out", i + 1);
            STRF(ds, "%s %s once", pass ? "enter" : "leave", N->label[i]);
            or_row(in, nm, pass ? "degree_in" : "degree_out", k, cols, co, 'E', 1, ds);
        }
    for (int i = 1; i < n; i++)
        for (int j = 1; j < n; j++) {
            if (i == j)
                continue;
            int cc[3] = {u[i], u[j], idx[i][j]};
            double o[3] = {1, -1, n - 1};
            STRF(nm, "mtz_%d_%d", i + 1, j + 1);
            STRF(ds, "order %s before %s if travelled", N->label[i], N->label[j]);
            or_row(in, nm, "subtour_elim", 3, cc, o, 'L', n - 2, ds);
        }
}

const or_family or_families_c_tab[] = {
    {"transshipment", "LP", build_transshipment},
    {"generalized_assignment", "MILP", build_gap},
    {"multi_knapsack", "MILP", build_multi_knapsack},
    {"parallel_machines", "MILP", build_makespan},
    {"portfolio", "LP", build_portfolio},
    {"fixed_charge_transport", "MILP", build_fixed_charge},
    {"tsp", "MILP", build_tsp},
};
const int or_families_c_n = (int)(sizeof or_families_c_tab / sizeof or_families_c_tab[0]);
