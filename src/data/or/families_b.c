/* data/or/families_b.c — problem families: multi-period production and inventory (lot sizing), shortest
 * path, maximum flow, set cover, bin packing and weekly staff scheduling; plus the family registry. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family.h"

static const char *const months[] = {"January", "February", "March",     "April",   "May",      "June",
                                     "July",    "August",   "September", "October", "November", "December"};
static const char *const days[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};

/* ---------------- lot sizing ---------------- */
typedef struct ls_skin {
    const char *skin, *org, *unit, *money, *item;
} ls_skin;

static const ls_skin ls_skins[] = {
    {"brewery", "a craft brewery", "hectolitres", "dollars", "lager"},
    {"bicycles", "a bicycle factory", "bicycles", "euros", "city bikes"},
    {"textiles", "a textile mill", "bolts of cloth", "dollars", "linen cloth"},
    {"pharma", "a contract drug maker", "batches", "thousand dollars", "tablet batches"},
    {"furniture", "a sofa maker", "sofas", "pounds", "sofas"},
    {"solar", "a solar-panel assembler", "panels (hundreds)", "dollars", "solar panels"},
};

static void build_lot_sizing(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const ls_skin *sk = &OR_PICK(r, ls_skins);
    in->skin = sk->skin;
    int T = or_tier_n(r, tier, 3, 4, 5, 6, 6, 8);
    bool setup = tier >= 1 && or_rng_unif(r) < 0.7;
    or_set *P = or_add_set(in, "t", "T", "month", "months", T);
    int m0 = or_rng_int(r, 0, 11);
    for (int t = 0; t < T; t++)
        snprintf(P->label[t], OR_LABEL, "%s", months[(m0 + t) % 12]);
    or_param *d = or_add_param(in, "d", "demand", 1, 0, -1);
    or_param *C = or_add_param(in, "C", "capacity", 1, 0, -1);
    or_param *p = or_add_param(in, "p", "unit_cost", 1, 0, -1);
    or_param *h = or_add_param(in, "h", "holding_cost", 0, -1, -1);
    or_param *S = setup ? or_add_param(in, "S", "setup_cost", 0, -1, -1) : NULL;
    double cumd = 0, cumc = 0;
    for (int t = 0; t < T; t++) {
        d->v[t] = 10 * or_rng_int(r, 2, 15);
        C->v[t] = 10 * or_rng_int(r, 6, 16);
        cumd += d->v[t];
        cumc += C->v[t];
        if (cumc < cumd) { /* feasibility: cumulative capacity covers cumulative demand */
            C->v[t] += cumd - cumc;
            cumc = cumd;
        }
        p->v[t] = or_rng_int(r, 8, 20);
    }
    h->v[0] = or_rng_int(r, 1, 4);
    if (S)
        S->v[0] = 10 * or_rng_int(r, 10, 60);
    STRF(d->desc, "demand in month t (%s)", sk->unit);
    STRF(d->header, "demand (%s)", sk->unit);
    STRF(d->sent, "Demand in {i} is {v} %s.", sk->unit);
    STRF(d->list_pre, "Monthly demand is ");
    STRF(d->list_elem, "{v} in {i}");
    STRF(C->desc, "production capacity in month t (%s)", sk->unit);
    STRF(C->header, "capacity (%s)", sk->unit);
    STRF(C->sent, "At most {v} %s can be produced in {i}.", sk->unit);
    STRF(C->list_pre, "Production capacity is ");
    STRF(C->list_elem, "{v} in {i}");
    STRF(p->desc, "cost of producing one unit in month t (%s)", sk->money);
    STRF(p->header, "unit cost (%s)", sk->money);
    STRF(p->sent, "Each unit made in {i} costs {v} %s.", sk->money);
    STRF(p->list_pre, "Unit production costs, in %s, are ", sk->money);
    STRF(p->list_elem, "{v} in {i}");
    STRF(h->desc, "cost of holding one unit from one month to the next (%s)", sk->money);
    STRF(h->sent, "Keeping one unit in stock at the end of a month costs {v} %s.", sk->money);
    if (S) {
        STRF(S->desc, "set-up cost paid in every month with production (%s)", sk->money);
        STRF(S->sent, "Any month in which the line runs at all incurs a set-up cost of {v} %s.", sk->money);
    }
    or_add_vfam(in, "x", "t", "continuous, >= 0", "amount produced in month t");
    or_add_vfam(in, "s", "t", "continuous, >= 0", "stock at the end of month t");
    if (S)
        or_add_vfam(in, "y", "t", "binary", "1 if the line runs in month t");
    or_add_cfam(in, "inventory_balance", true, "s_{t-1} + x_{t} - s_{t} = d_{t} \\quad \\forall t \\; (s_{0} = 0)",
                "stock carried in plus production equals demand plus stock carried out");
    if (S)
        or_add_cfam(in, "setup_link", true, "x_{t} \\le C_{t} y_{t} \\quad \\forall t",
                    "production needs the set-up and is limited by capacity (tight big-M = capacity)");
    else
        or_add_cfam(in, "capacity", true, "x_{t} \\le C_{t} \\quad \\forall t", "production is limited by "
                                                                                 "capacity");
    STRF(in->obj_math, "\\min \\sum_{t} (p_{t} x_{t} + h s_{t}%s)", S ? " + S y_{t}" : "");
    STRF(in->obj_desc, "production, holding%s costs", S ? " and set-up" : "");
    STRF(in->obj_noun, "total cost (%s)", sk->money);
    char pl[400];
    or_join_labels(P, pl, sizeof pl);
    STRF(in->intro, "A planner at %s schedules production of %s for %s.", sk->org, sk->item, pl);
    STRF(in->rules, "There is no stock at the start, demand must be met on time every month (no backorders), and "
                    "units made early can be held in stock. The planner wants the cheapest plan.");
    STRF(in->integrality, "%s", S ? "Whether the line runs in a month is a yes-or-no decision; quantities may be "
                                    "fractional."
                                  : "Quantities may be fractional.");
    STRF(in->ask, "How much should be produced each month, and what is the minimum total cost?");
    char nm[40], ds[96];
    int xs = 0, ss = T, ys = 2 * T;
    for (int t = 0; t < T; t++) {
        STRF(nm, "x_%d", t + 1);
        STRF(ds, "%s produced in %s", sk->unit, P->label[t]);
        or_col(in, nm, 0, INFINITY, p->v[t], TREX_OR_CONT, ds);
    }
    for (int t = 0; t < T; t++) {
        STRF(nm, "s_%d", t + 1);
        STRF(ds, "%s in stock at the end of %s", sk->unit, P->label[t]);
        or_col(in, nm, 0, INFINITY, h->v[0], TREX_OR_CONT, ds);
    }
    for (int t = 0; S && t < T; t++) {
        STRF(nm, "y_%d", t + 1);
        STRF(ds, "run the line in %s", P->label[t]);
        or_col(in, nm, 0, 1, S->v[0], TREX_OR_BIN, ds);
    }
    for (int t = 0; t < T; t++) {
        int cols[3] = {xs + t, ss + t, ss + t - 1};
        double co[3] = {1, -1, 1};
        STRF(nm, "bal_%d", t + 1);
        STRF(ds, "stock balance in %s", P->label[t]);
        or_row(in, nm, "inventory_balance", t == 0 ? 2 : 3, cols, co, 'E', d->v[t], ds);
    }
    for (int t = 0; t < T; t++) {
        int cols[2] = {xs + t, ys + t};
        double co[2] = {1, -C->v[t]};
        STRF(nm, "cap_%d", t + 1);
        STRF(ds, "capacity in %s", P->label[t]);
        or_row(in, nm, S ? "setup_link" : "capacity", S ? 2 : 1, cols, co, 'L', S ? 0 : C->v[t], ds);
    }
}

/* ---------------- networks: shortest path and max flow ---------------- */
typedef struct net_skin {
    const char *skin, *node_sg, *node_pl, *arc_word, *len_word, *len_unit, *cap_unit, *goods;
} net_skin;

static const net_skin net_skins[] = {
    {"roads", "junction", "junctions", "road", "travel time", "minutes", "vehicles per hour", "traffic"},
    {"pipeline", "pumping station", "pumping stations", "pipe", "pumping cost", "dollars", "cubic metres per hour",
     "water"},
    {"data", "router", "routers", "link", "latency", "milliseconds", "gigabits per second", "data"},
    {"trails", "hut", "huts", "trail", "walking time", "minutes", "hikers per hour", "hikers"},
    {"rail", "station", "stations", "line", "travel cost", "euros", "wagons per day", "freight"},
};

/* Random digraph on n nodes with a guaranteed path 0 -> ... -> n-1; arcs[i][j] true if present. */
static void random_net(or_rng *r, int n, double density, bool arc[OR_MAX_MEMBERS][OR_MAX_MEMBERS])
{
    memset(arc, 0, sizeof(bool) * OR_MAX_MEMBERS * OR_MAX_MEMBERS);
    int perm[OR_MAX_MEMBERS];
    for (int k = 0; k < n - 2; k++)
        perm[k] = k + 1;
    or_rng_shuffle(r, perm, n - 2);
    int len = or_rng_int(r, 1, n - 2), prev = 0;
    for (int k = 0; k < len; k++) {
        arc[prev][perm[k]] = true;
        prev = perm[k];
    }
    arc[prev][n - 1] = true;
    for (int i = 0; i < n - 1; i++)
        for (int j = 1; j < n; j++)
            if (i != j && !arc[j][i] && or_rng_unif(r) < density)
                arc[i][j] = true;
}

static void build_network(or_inst *in, int tier, or_rng *r, bool maxflow)
{
    in->m.sense = maxflow ? TREX_OR_MAX : TREX_OR_MIN;
    const net_skin *sk = &OR_PICK(r, net_skins);
    in->skin = sk->skin;
    int n = or_tier_n(r, tier, 4, 5, 6, 7, 8, 9);
    or_set *N = or_add_set(in, "i", "N", sk->node_sg, sk->node_pl, n);
    or_set_labels(N, r, or_place_names, or_nplace_names, NULL);
    or_add_set(in, "j", "N", sk->node_sg, sk->node_pl, n);
    memcpy(in->sets[1].label, N->label, sizeof N->label);
    bool arc[OR_MAX_MEMBERS][OR_MAX_MEMBERS];
    random_net(r, n, tier == 0 ? 0.3 : 0.25, arc);
    or_param *w = or_add_param(in, maxflow ? "u" : "c", maxflow ? "capacity" : "length", 2, 0, 1);
    w->sparse = true;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            OR_P2(w, i, j) = arc[i][j] ? (maxflow ? 5 * or_rng_int(r, 2, 20) : or_rng_int(r, 3, 40)) : NAN;
    const char *src = N->label[0], *dst = N->label[n - 1];
    if (maxflow) {
        STRF(w->desc, "capacity of the %s from i to j (%s)", sk->arc_word, sk->cap_unit);
        STRF(w->row_pre, "From {i}, %ss lead to ", sk->arc_word);
        STRF(w->row_elem, "{j} (capacity {v})");
    } else {
        STRF(w->desc, "%s of the %s from i to j (%s)", sk->len_word, sk->arc_word, sk->len_unit);
        STRF(w->row_pre, "From {i}, one-way %ss lead to ", sk->arc_word);
        STRF(w->row_elem, "{j} ({v} %s)", sk->len_unit);
    }
    or_add_vfam(in, "x", "i,j", "continuous, >= 0", maxflow ? "flow on arc (i,j)" : "1 if arc (i,j) is on the path "
                                                                                    "(the LP is integral)");
    if (maxflow) {
        or_add_vfam(in, "F", "", "continuous, >= 0", "total flow from the source to the sink");
        or_add_cfam(in, "flow_conservation", true,
                    "\\sum_{j} x_{ij} - \\sum_{j} x_{ji} = F [i = s] - F [i = t] \\quad \\forall i",
                    "flow is conserved at every intermediate node");
        or_add_cfam(in, "arc_capacity", true, "x_{ij} \\le u_{ij}", "no arc carries more than its capacity");
        STRF(in->obj_math, "\\max F");
        STRF(in->obj_desc, "flow from the source to the sink");
        STRF(in->obj_noun, "maximum flow (%s)", sk->cap_unit);
        STRF(in->intro, "A network of %s connects %s to %s through one-way %ss; each %s has a capacity in %s.",
             sk->node_pl, src, dst, sk->arc_word, sk->arc_word, sk->cap_unit);
        STRF(in->rules, "Whatever enters an intermediate %s must leave it, and no %s may carry more than its "
                        "capacity. The operator wants to send as much %s as possible from %s to %s.",
             sk->node_sg, sk->arc_word, sk->goods, src, dst);
        STRF(in->integrality, "Flows may be fractional.");
        STRF(in->ask, "What is the largest flow that can be sent from %s to %s, and how is it routed?", src, dst);
    } else {
        or_add_cfam(in, "flow_balance", true,
                    "\\sum_{j} x_{ij} - \\sum_{j} x_{ji} = [i = s] - [i = t] \\quad \\forall i",
                    "one unit leaves the start, one arrives at the end, and every other node passes it on");
        STRF(in->obj_math, "\\min \\sum_{(i,j)} c_{ij} x_{ij}");
        STRF(in->obj_desc, "total %s of the route", sk->len_word);
        STRF(in->obj_noun, "total %s (%s)", sk->len_word, sk->len_unit);
        STRF(in->intro, "A network of %s is connected by one-way %ss. A route is needed from %s to %s.",
             sk->node_pl, sk->arc_word, src, dst);
        STRF(in->rules, "The route may pass through any %s but must follow the %ss in their direction. The goal is "
                        "the route with the smallest total %s.",
             sk->node_sg, sk->arc_word, sk->len_word);
        STRF(in->integrality, "The flow formulation has integral optima, so the arc variables may be continuous.");
        STRF(in->ask, "Which route from %s to %s has the smallest total %s, and what is it?", src, dst, sk->len_word);
    }
    int idx[OR_MAX_MEMBERS][OR_MAX_MEMBERS];
    char nm[40], ds[96];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            idx[i][j] = -1;
            if (!arc[i][j])
                continue;
            STRF(nm, "x_%d_%d", i + 1, j + 1);
            STRF(ds, "%s on the %s %s to %s", maxflow ? "flow" : "use", sk->arc_word, N->label[i], N->label[j]);
            idx[i][j] = or_col(in, nm, 0, INFINITY, maxflow ? 0 : OR_P2(w, i, j), TREX_OR_CONT, ds);
        }
    int F = maxflow ? or_col(in, "F", 0, INFINITY, 1, TREX_OR_CONT, "total flow") : -1;
    int cols[2 * OR_MAX_MEMBERS + 1];
    double co[2 * OR_MAX_MEMBERS + 1];
    for (int i = 0; i < n; i++) {
        int k = 0;
        for (int j = 0; j < n; j++) {
            if (idx[i][j] >= 0) {
                cols[k] = idx[i][j];
                co[k++] = 1;
            }
            if (idx[j][i] >= 0) {
                cols[k] = idx[j][i];
                co[k++] = -1;
            }
        }
        double rhs = 0;
        if (maxflow && (i == 0 || i == n - 1)) {
            cols[k] = F;
            co[k++] = i == 0 ? -1 : 1;
        } else if (!maxflow)
            rhs = i == 0 ? 1 : i == n - 1 ? -1 : 0;
        if (k == 0)
            continue;
        STRF(nm, "node_%d", i + 1);
        STRF(ds, "balance at %s", N->label[i]);
        or_row(in, nm, maxflow ? "flow_conservation" : "flow_balance", k, cols, co, 'E', rhs, ds);
    }
    for (int i = 0; maxflow && i < n; i++)
        for (int j = 0; j < n; j++)
            if (idx[i][j] >= 0) {
                double one = 1;
                STRF(nm, "cap_%d_%d", i + 1, j + 1);
                STRF(ds, "capacity %s to %s", N->label[i], N->label[j]);
                or_row(in, nm, "arc_capacity", 1, &idx[i][j], &one, 'L', OR_P2(w, i, j), ds);
            }
}

static void build_shortest_path(or_inst *in, int tier, or_rng *r) { build_network(in, tier, r, false); }
static void build_max_flow(or_inst *in, int tier, or_rng *r) { build_network(in, tier, r, true); }

/* ---------------- set cover ---------------- */
typedef struct sc_skin {
    const char *skin, *site_sg, *site_pl, *zone_sg, *zone_pl, *money, *verb;
} sc_skin;

static const sc_skin sc_skins[] = {
    {"fire_stations", "candidate fire station", "candidate fire stations", "district", "districts",
     "million dollars", "reach within the response-time target"},
    {"cell_towers", "tower site", "tower sites", "neighbourhood", "neighbourhoods", "thousand euros",
     "cover with signal"},
    {"clinics", "possible clinic location", "possible clinic locations", "village", "villages", "thousand dollars",
     "serve within an hour's travel"},
    {"cameras", "camera mount", "camera mounts", "zone", "zones", "hundred dollars", "see"},
    {"lockers", "parcel-locker site", "parcel-locker sites", "block", "blocks", "thousand pounds",
     "serve on foot"},
};

static void build_set_cover(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const sc_skin *sk = &OR_PICK(r, sc_skins);
    in->skin = sk->skin;
    int ns = or_tier_n(r, tier, 4, 5, 6, 8, 8, 10), nz = or_tier_n(r, tier, 4, 6, 7, 9, 9, 12);
    bool multi = tier == 2;
    or_set *S = or_add_set(in, "i", "I", sk->site_sg, sk->site_pl, ns);
    or_set_labels(S, r, or_place_names, 21, NULL);
    or_set *Z = or_add_set(in, "j", "J", sk->zone_sg, sk->zone_pl, nz);
    or_set_labels(Z, r, or_place_names + 21, or_nplace_names - 21, NULL);
    or_param *c = or_add_param(in, "c", "cost", 1, 0, -1);
    or_param *a = or_add_param(in, "a", "covers", 2, 0, 1);
    or_param *q = multi ? or_add_param(in, "q", "required", 1, 1, -1) : NULL;
    a->incidence = true;
    for (int i = 0; i < ns; i++) {
        c->v[i] = or_rng_int(r, 2, 15);
        for (int j = 0; j < nz; j++)
            OR_P2(a, i, j) = or_rng_unif(r) < 0.3 ? 1 : 0;
    }
    for (int j = 0; j < nz; j++) {
        int need = q ? (or_rng_unif(r) < 0.3 ? 2 : 1) : 1, have = 0;
        for (int i = 0; i < ns; i++)
            have += OR_P2(a, i, j) != 0;
        while (have < need + (tier > 0)) { /* every zone coverable, with a choice from tier 1 on */
            int i = or_rng_int(r, 0, ns - 1);
            if (OR_P2(a, i, j) == 0) {
                OR_P2(a, i, j) = 1;
                have++;
            }
        }
        if (q)
            q->v[j] = need;
    }
    STRF(c->desc, "cost of using %s i (%s)", sk->site_sg, sk->money);
    STRF(c->header, "cost (%s)", sk->money);
    STRF(c->sent, "Using {i} costs {v} %s.", sk->money);
    STRF(c->list_pre, "Costs, in %s, are ", sk->money);
    STRF(c->list_elem, "{v} for {i}");
    STRF(a->desc, "1 if site i can %s zone j", sk->verb);
    STRF(a->row_pre, "{i} can %s ", sk->verb);
    STRF(a->row_elem, "{j}");
    STRF(a->header, "%ss it can %s", sk->zone_sg, sk->verb);
    if (q) {
        STRF(q->desc, "number of chosen sites that must cover zone j");
        STRF(q->header, "sites required");
        STRF(q->sent, "{i} must be covered by at least {v} chosen sites.");
        STRF(q->list_pre, "Required coverage levels are ");
        STRF(q->list_elem, "{v} for {i}");
    }
    or_add_vfam(in, "y", "i", "binary", "1 if site i is used");
    or_add_cfam(in, "coverage", true, q ? "\\sum_{i} a_{ij} y_{i} \\ge q_{j} \\quad \\forall j"
                                        : "\\sum_{i} a_{ij} y_{i} \\ge 1 \\quad \\forall j",
                "every zone gets the coverage it needs");
    STRF(in->obj_math, "\\min \\sum_{i} c_{i} y_{i}");
    STRF(in->obj_desc, "total cost of the chosen sites");
    STRF(in->obj_noun, "total cost (%s)", sk->money);
    char zl[600];
    or_join_labels(Z, zl, sizeof zl);
    STRF(in->intro, "A planning office must choose %s so that it can %s every %s: %s.", sk->site_pl, sk->verb,
         sk->zone_sg, zl);
    STRF(in->rules, "%s The office wants to spend as little as possible.",
         q ? "Some zones need more than one chosen site, as listed." : "Every zone needs at least one chosen site "
                                                                       "that covers it.");
    STRF(in->integrality, "Each site is either used or not.");
    STRF(in->ask, "Which sites should be chosen, and what is the minimum total cost?");
    char nm[40], ds[96];
    for (int i = 0; i < ns; i++) {
        STRF(nm, "y_%d", i + 1);
        STRF(ds, "use %s", S->label[i]);
        or_col(in, nm, 0, 1, c->v[i], TREX_OR_BIN, ds);
    }
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    for (int j = 0; j < nz; j++) {
        int k = 0;
        for (int i = 0; i < ns; i++)
            if (OR_P2(a, i, j) != 0) {
                cols[k] = i;
                co[k++] = 1;
            }
        STRF(nm, "cover_%d", j + 1);
        STRF(ds, "coverage of %s", Z->label[j]);
        or_row(in, nm, "coverage", k, cols, co, 'G', q ? q->v[j] : 1, ds);
    }
}

/* ---------------- bin packing ---------------- */
typedef struct bp_skin {
    const char *skin, *item_sg, *item_pl, *bin_sg, *bin_pl, *unit, *binword;
} bp_skin;

static const bp_skin bp_skins[] = {
    {"trucks", "pallet", "pallets", "truck", "trucks", "kg", "Truck"},
    {"servers", "virtual machine", "virtual machines", "host", "hosts", "GB of memory", "Host"},
    {"moving", "box", "boxes", "van trip", "van trips", "kg", "Trip"},
    {"containers", "crate", "crates", "container", "containers", "cubic feet", "Container"},
    {"studio", "recording session", "recording sessions", "studio day", "studio days", "minutes", "Day"},
};

static void build_bin_packing(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const bp_skin *sk = &OR_PICK(r, bp_skins);
    in->skin = sk->skin;
    int n = or_tier_n(r, tier, 4, 5, 6, 7, 8, 9);
    or_set *I = or_add_set(in, "i", "I", sk->item_sg, sk->item_pl, n);
    or_set_labels(I, r, NULL, 0, sk->item_sg[0] >= 'a' ? "Item" : "Item");
    or_param *w = or_add_param(in, "w", "size", 1, 0, -1);
    or_param *Cp = or_add_param(in, "C", "capacity", 0, -1, -1);
    Cp->v[0] = 10 * or_rng_int(r, 8, 20);
    double sz[OR_MAX_MEMBERS];
    for (int i = 0; i < n; i++)
        sz[i] = w->v[i] = or_rng_int(r, (int)(Cp->v[0] * 0.15), (int)(Cp->v[0] * 0.6));
    /* first-fit decreasing gives the number of bins K (an upper bound on the optimum) */
    double tmp[OR_MAX_MEMBERS], load[OR_MAX_MEMBERS];
    memcpy(tmp, sz, sizeof tmp);
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (tmp[b] > tmp[a]) {
                double t = tmp[a];
                tmp[a] = tmp[b];
                tmp[b] = t;
            }
    int K = 0;
    for (int a = 0; a < n; a++) {
        int k;
        for (k = 0; k < K; k++)
            if (load[k] + tmp[a] <= Cp->v[0])
                break;
        if (k == K)
            load[K++] = 0;
        load[k] += tmp[a];
    }
    or_set *B = or_add_set(in, "k", "K", sk->bin_sg, sk->bin_pl, K);
    or_set_labels(B, r, NULL, 0, sk->binword);
    STRF(w->desc, "size of %s i (%s)", sk->item_sg, sk->unit);
    STRF(w->header, "size (%s)", sk->unit);
    STRF(w->sent, "{i} needs {v} %s.", sk->unit);
    STRF(w->list_pre, "Sizes are ");
    STRF(w->list_elem, "{v} %s for {i}", sk->unit);
    STRF(Cp->desc, "capacity of each %s (%s)", sk->bin_sg, sk->unit);
    STRF(Cp->sent, "Each %s holds at most {v} %s.", sk->bin_sg, sk->unit);
    or_add_vfam(in, "y", "k", "binary", "1 if bin k is used");
    or_add_vfam(in, "x", "i,k", "binary", "1 if item i goes into bin k");
    or_add_cfam(in, "assign_once", true, "\\sum_{k} x_{ik} = 1 \\quad \\forall i", "every item is packed once");
    or_add_cfam(in, "bin_capacity", true, "\\sum_{i} w_{i} x_{ik} \\le C y_{k} \\quad \\forall k",
                "a used bin holds at most its capacity; an unused bin holds nothing");
    or_add_cfam(in, "symmetry_break", false, "y_{k+1} \\le y_{k}", "bins are used in order (removes symmetric "
                                                                   "copies of the same packing)");
    STRF(in->obj_math, "\\min \\sum_{k} y_{k}");
    STRF(in->obj_desc, "number of bins used");
    STRF(in->obj_noun, "number of %s used", sk->bin_pl);
    char bl[400];
    or_join_labels(B, bl, sizeof bl);
    STRF(in->intro, "Several %s must be packed into %s; the available %s are %s.", sk->item_pl, sk->bin_pl,
         sk->bin_pl, bl);
    STRF(in->rules, "Each %s goes into exactly one %s and cannot be split. The goal is to use as few %s as "
                    "possible.",
         sk->item_sg, sk->bin_sg, sk->bin_pl);
    STRF(in->integrality, "Packing decisions are yes-or-no.");
    STRF(in->ask, "What is the smallest number of %s needed, and how should the %s be packed?", sk->bin_pl,
         sk->item_pl);
    char nm[40], ds[96];
    for (int k = 0; k < K; k++) {
        STRF(nm, "y_%d", k + 1);
        STRF(ds, "use %s", B->label[k]);
        or_col(in, nm, 0, 1, 1, TREX_OR_BIN, ds);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < K; k++) {
            STRF(nm, "x_%d_%d", i + 1, k + 1);
            STRF(ds, "%s in %s", I->label[i], B->label[k]);
            or_col(in, nm, 0, 1, 0, TREX_OR_BIN, ds);
        }
    int cols[OR_MAX_MEMBERS + 1];
    double co[OR_MAX_MEMBERS + 1];
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < K; k++) {
            cols[k] = K + i * K + k;
            co[k] = 1;
        }
        STRF(nm, "assign_%d", i + 1);
        STRF(ds, "%s packed once", I->label[i]);
        or_row(in, nm, "assign_once", K, cols, co, 'E', 1, ds);
    }
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < n; i++) {
            cols[i] = K + i * K + k;
            co[i] = w->v[i];
        }
        cols[n] = k;
        co[n] = -Cp->v[0];
        STRF(nm, "cap_%d", k + 1);
        STRF(ds, "capacity of %s", B->label[k]);
        or_row(in, nm, "bin_capacity", n + 1, cols, co, 'L', 0, ds);
    }
    for (int k = 1; k < K; k++) {
        int cc[2] = {k, k - 1};
        double o[2] = {1, -1};
        STRF(nm, "order_%d", k + 1);
        STRF(ds, "use %s only after %s", B->label[k], B->label[k - 1]);
        or_row(in, nm, "symmetry_break", 2, cc, o, 'L', 0, ds);
    }
}

/* ---------------- staff scheduling ---------------- */
typedef struct ss_skin {
    const char *skin, *org, *staff_sg, *staff_pl, *money;
} ss_skin;

static const ss_skin ss_skins[] = {
    {"nurses", "a hospital ward", "nurse", "nurses", "dollars"},
    {"call_centre", "a call centre", "agent", "agents", "euros"},
    {"bus_drivers", "a bus depot", "driver", "drivers", "dollars"},
    {"lifeguards", "a public beach", "lifeguard", "lifeguards", "dollars"},
    {"warehouse", "a fulfilment warehouse", "picker", "pickers", "pounds"},
};

static void build_staff(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const ss_skin *sk = &OR_PICK(r, ss_skins);
    in->skin = sk->skin;
    bool costs = tier >= 1, parttime = tier == 2;
    or_set *D = or_add_set(in, "d", "D", "day", "days", 7);
    for (int k = 0; k < 7; k++)
        snprintf(D->label[k], OR_LABEL, "%s", days[k]);
    int ns = parttime ? 14 : 7;
    or_set *S = or_add_set(in, "s", "S", "shift pattern", "shift patterns", ns);
    for (int k = 0; k < ns; k++)
        snprintf(S->label[k], OR_LABEL, "%s-start %s", days[k % 7], k < 7 ? "full-time" : "part-time");
    or_param *q = or_add_param(in, "r", "required", 1, 0, -1);
    or_param *w = costs ? or_add_param(in, "w", "weekly_cost", 1, 1, -1) : NULL;
    for (int k = 0; k < 7; k++)
        q->v[k] = or_rng_int(r, 4, 20);
    if (w) {
        int base = 10 * or_rng_int(r, 50, 90), prem = 10 * or_rng_int(r, 2, 12);
        for (int k = 0; k < ns; k++) {
            bool weekend = false;
            int len = k < 7 ? 5 : 3;
            for (int t = 0; t < len; t++)
                if ((k + t) % 7 >= 5)
                    weekend = true;
            w->v[k] = (k < 7 ? base : floor(base * 0.6 / 10) * 10) + (weekend ? prem : 0);
        }
    }
    STRF(q->desc, "number of %s needed on day d", sk->staff_pl);
    STRF(q->header, "%s needed", sk->staff_pl);
    STRF(q->sent, "On {i} at least {v} %s must be on duty.", sk->staff_pl);
    STRF(q->list_pre, "Daily requirements are ");
    STRF(q->list_elem, "{v} on {i}");
    if (w) {
        STRF(w->desc, "weekly cost of one %s on pattern s (%s)", sk->staff_sg, sk->money);
        STRF(w->header, "weekly cost (%s)", sk->money);
        STRF(w->sent, "A %s on the {i} pattern costs {v} %s per week.", sk->staff_sg, sk->money);
        STRF(w->list_pre, "Weekly costs per %s, in %s, are ", sk->staff_sg, sk->money);
        STRF(w->list_elem, "{v} for the {i} pattern");
    }
    or_add_vfam(in, "x", "s", "integer, >= 0", "number of staff on shift pattern s");
    or_add_cfam(in, "coverage", true, "\\sum_{s \\ni d} x_{s} \\ge r_{d} \\quad \\forall d",
                "enough staff work on every day");
    STRF(in->obj_math, w ? "\\min \\sum_{s} w_{s} x_{s}" : "\\min \\sum_{s} x_{s}");
    STRF(in->obj_desc, w ? "total weekly wage cost" : "number of staff hired");
    if (w)
        STRF(in->obj_noun, "total weekly cost (%s)", sk->money);
    else
        STRF(in->obj_noun, "number of %s", sk->staff_pl);
    STRF(in->intro, "The manager of %s needs a weekly roster of %s.", sk->org, sk->staff_pl);
    STRF(in->rules, "Full-time %s work five consecutive days and then have two days off; the pattern can start on "
                    "any day of the week and repeats weekly.%s Every day must have enough %s on duty. %s",
         sk->staff_pl,
         parttime ? " Part-time staff work three consecutive days, again starting on any day." : "",
         sk->staff_pl, w ? "The manager wants the cheapest roster." : "The manager wants to hire as few people as "
                                                                      "possible.");
    STRF(in->integrality, "Staff numbers must be whole numbers.");
    STRF(in->ask, "How many %s should start on each pattern, and what is the minimum %s?", sk->staff_pl,
         w ? "weekly cost" : "number of staff");
    char nm[40], ds[96];
    for (int k = 0; k < ns; k++) {
        STRF(nm, "x_%d", k + 1);
        STRF(ds, "%s on the %s pattern", sk->staff_pl, S->label[k]);
        or_col(in, nm, 0, INFINITY, w ? w->v[k] : 1, TREX_OR_INT, ds);
    }
    int cols[14];
    double co[14];
    for (int d = 0; d < 7; d++) {
        int k2 = 0;
        for (int k = 0; k < ns; k++) {
            int len = k < 7 ? 5 : 3, start = k % 7;
            int off = (d - start + 7) % 7;
            if (off < len) {
                cols[k2] = k;
                co[k2++] = 1;
            }
        }
        STRF(nm, "day_%d", d + 1);
        STRF(ds, "staff on %s", D->label[d]);
        or_row(in, nm, "coverage", k2, cols, co, 'G', q->v[d], ds);
    }
}

const or_family or_families_b_tab[] = {
    {"lot_sizing", "LP/MILP", build_lot_sizing},
    {"shortest_path", "LP", build_shortest_path},
    {"max_flow", "LP", build_max_flow},
    {"set_cover", "MILP", build_set_cover},
    {"bin_packing", "MILP", build_bin_packing},
    {"staff_scheduling", "MILP", build_staff},
};
const int or_families_b_n = (int)(sizeof or_families_b_tab / sizeof or_families_b_tab[0]);

const or_family *or_family_get(int f)
{
    TREX_ASSERT(f >= 0 && f < trex_or_family_count());
    if (f < or_families_a_n)
        return &or_families_a_tab[f];
    f -= or_families_a_n;
    if (f < or_families_b_n)
        return &or_families_b_tab[f];
    return &or_families_c_tab[f - or_families_b_n];
}

int trex_or_family_count(void) { return or_families_a_n + or_families_b_n + or_families_c_n; }

const char *trex_or_family_name(int f) { return or_family_get(f)->name; }
