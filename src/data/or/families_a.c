/* data/or/families_a.c — problem families: product mix, diet, blending, transportation, assignment,
 * knapsack (capital budgeting) and capacitated facility location.
 *
 * Each builder draws sizes from the tier, data from the rng, and makes the instance feasible by
 * construction (a certificate first, then constraints derived from it, OR_PIPELINE 3.7). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "family.h"

/* ---------------- product mix ---------------- */
typedef struct pm_skin {
    const char *skin, *org, *period, *money;
    const char *prod[10];
    const char *res[8];
} pm_skin;

static const pm_skin pm_skins[] = {
    {"furniture", "a furniture workshop", "week", "dollars",
     {"dining table", "bookshelf", "desk", "wardrobe", "stool", "cabinet", "bench", "bed frame", "dresser", NULL},
     {"hours of cutting", "hours of assembly", "hours of finishing", "board-metres of oak", "litres of varnish",
      "hours of packing", NULL}},
    {"bakery", "an artisan bakery", "day", "euros",
     {"sourdough loaf", "baguette", "croissant tray", "rye loaf", "focaccia sheet", "brioche loaf", "bagel batch",
      "muffin tray", NULL},
     {"kg of flour", "oven hours", "hours of kneading", "kg of butter", "kg of sugar", "hours of proofing", NULL}},
    {"electronics", "an electronics assembler", "week", "dollars",
     {"smart thermostat", "door sensor", "wifi router", "power bank", "smart plug", "camera module", "hub unit",
      "light switch", NULL},
     {"hours of SMT line time", "hours of testing", "hours of manual assembly", "hours of firmware flashing",
      "hours of packaging", "hours of burn-in", NULL}},
    {"garments", "a clothing factory", "week", "pounds",
     {"jacket", "pair of trousers", "shirt", "dress", "vest", "skirt", "coat", "hoodie", NULL},
     {"metres of fabric", "sewing hours", "cutting hours", "pressing hours", "hours of quality control",
      "hours of embroidery", NULL}},
    {"cosmetics", "a small cosmetics lab", "week", "dollars",
     {"face cream jar", "lip balm box", "shampoo case", "soap crate", "serum vial pack", "body lotion case",
      "sunscreen case", NULL},
     {"litres of base oil", "mixing hours", "filling hours", "kg of shea butter", "hours of labelling",
      "litres of distilled water", NULL}},
};

static void build_product_mix(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MAX;
    const pm_skin *sk = &OR_PICK(r, pm_skins);
    in->skin = sk->skin;
    int np = or_tier_n(r, tier, 2, 3, 4, 5, 6, 7), nr = or_tier_n(r, tier, 2, 3, 3, 4, 4, 6);
    bool integer = or_rng_unif(r) < 0.5, demand = tier > 0;
    or_set *P = or_add_set(in, "j", "J", "product", "products", np);
    np = or_set_from_list(P, r, sk->prod);
    or_set *R = or_add_set(in, "i", "I", "resource", "resources", nr);
    nr = or_set_from_list(R, r, sk->res);
    or_param *pr = or_add_param(in, "p", "profit", 1, 0, -1);
    or_param *a = or_add_param(in, "a", "usage", 2, 0, 1);
    or_param *b = or_add_param(in, "b", "available", 1, 1, -1);
    or_param *u = demand ? or_add_param(in, "u", "max_sales", 1, 0, -1) : NULL;
    double x0[OR_MAX_MEMBERS];
    for (int j = 0; j < np; j++) {
        pr->v[j] = or_rng_int(r, 8, 60);
        x0[j] = or_rng_int(r, 3, 25);
        for (int i = 0; i < nr; i++)
            OR_P2(a, j, i) = (tier == 2 && or_rng_unif(r) < 0.2) ? 0 : or_rng_int(r, 1, 9);
    }
    for (int i = 0; i < nr; i++) {
        double use = 0;
        for (int j = 0; j < np; j++)
            use += OR_P2(a, j, i) * x0[j];
        b->v[i] = fmax(10, floor(use * (0.75 + 0.2 * or_rng_unif(r))));
    }
    if (u)
        for (int j = 0; j < np; j++)
            u->v[j] = floor(x0[j] * (0.6 + 0.8 * or_rng_unif(r))) + 1;
    STRF(pr->desc, "profit per %s of product j (%s)", "unit", sk->money);
    STRF(pr->header, "profit per unit (%s)", sk->money);
    STRF(pr->unit, "%s", sk->money);
    STRF(pr->sent, "Each {i} earns a profit of {v} {u}.");
    STRF(pr->list_pre, "The profit per unit, in %s, is ", sk->money);
    STRF(pr->list_elem, "{v} for each {i}");
    STRF(a->desc, "amount of resource i used by one unit of product j");
    STRF(a->row_pre, "Making one {i} uses ");
    STRF(a->row_elem, "{v} {j}");
    STRF(b->desc, "amount of resource i available per %s", sk->period);
    STRF(b->header, "available per %s", sk->period);
    STRF(b->sent, "At most {v} {i} are available per %s.", sk->period);
    STRF(b->list_pre, "The %s's supply of each resource is limited to ", sk->period);
    STRF(b->list_elem, "{v} {i}");
    if (u) {
        STRF(u->desc, "largest quantity of product j that can be sold per %s", sk->period);
        STRF(u->header, "max sales per %s", sk->period);
        STRF(u->sent, "No more than {v} of the {i} units can be sold per %s.", sk->period);
        STRF(u->list_pre, "Market limits cap the %s's sales at ", sk->period);
        STRF(u->list_elem, "{v} for the {i}");
    }
    or_add_vfam(in, "x", "j", integer ? "integer, >= 0" : "continuous, >= 0", "units of product j made");
    or_add_cfam(in, "resource_capacity", true, "\\sum_{j} a_{ij} x_{j} \\le b_{i} \\quad \\forall i",
                "the plan may not use more of a resource than is available");
    if (u)
        or_add_cfam(in, "demand_cap", true, "x_{j} \\le u_{j} \\quad \\forall j", "nothing is made beyond what "
                                                                                  "can be sold");
    STRF(in->obj_math, "\\max \\sum_{j} p_{j} x_{j}");
    STRF(in->obj_desc, "total profit");
    STRF(in->obj_noun, "total profit per %s (%s)", sk->period, sk->money);
    char plist[400], rlist[400];
    or_join_labels(P, plist, sizeof plist);
    or_join_labels(R, rlist, sizeof rlist);
    STRF(in->intro, "%s makes the following products: %s. Production draws on these resources: %s.", sk->org,
         plist, rlist);
    in->intro[0] = (char)(in->intro[0] >= 'a' && in->intro[0] <= 'z' ? in->intro[0] - 32 : in->intro[0]);
    STRF(in->rules, "The production plan for one %s must respect the resource limits%s. The manager wants the "
                    "mix that earns the largest total profit.",
         sk->period, u ? " and must not exceed what the market can absorb" : "");
    STRF(in->integrality, "%s", integer ? "Only whole units can be made, so every quantity must be an integer."
                                        : "Quantities may be fractional (the plan is an average rate).");
    STRF(in->ask, "How many units of each product should be made per %s, and what is the largest total profit?",
         sk->period);
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    char nm[40], d[96];
    for (int j = 0; j < np; j++) {
        STRF(nm, "x_%d", j + 1);
        STRF(d, "units of %s made", P->label[j]);
        cols[j] = or_col(in, nm, 0, INFINITY, pr->v[j], integer ? TREX_OR_INT : TREX_OR_CONT, d);
    }
    for (int i = 0; i < nr; i++) {
        int n = 0;
        for (int j = 0; j < np; j++)
            if (OR_P2(a, j, i) != 0) {
                co[n] = OR_P2(a, j, i);
                cols[n++] = j;
            }
        STRF(nm, "res_%d", i + 1);
        STRF(d, "limit on %s", R->label[i]);
        or_row(in, nm, "resource_capacity", n, cols, co, 'L', b->v[i], d);
    }
    for (int j = 0; u && j < np; j++) {
        double one = 1;
        STRF(nm, "dem_%d", j + 1);
        STRF(d, "sales limit for %s", P->label[j]);
        or_row(in, nm, "demand_cap", 1, &j, &one, 'L', u->v[j], d);
    }
}

/* ---------------- diet ---------------- */
typedef struct diet_skin {
    const char *skin, *who, *food_sg, *food_pl, *portion, *money;
    const char *foods[12];
    const char *nutr[8];
} diet_skin;

static const diet_skin diet_skins[] = {
    {"livestock_feed", "a cattle farm preparing a daily ration for one animal", "feed", "feeds", "kg", "dollars",
     {"corn silage", "alfalfa hay", "soybean meal", "barley", "wheat bran", "cottonseed meal", "oat hay",
      "beet pulp", NULL},
     {"units of protein", "units of energy", "grams of calcium", "grams of phosphorus", "grams of fibre", NULL}},
    {"hospital_menu", "a hospital kitchen planning a patient's daily menu", "food", "foods", "serving", "euros",
     {"oatmeal", "whole-wheat bread", "lentil soup", "yoghurt", "chicken breast", "brown rice", "spinach",
      "apple", "salmon", "tofu", NULL},
     {"grams of protein", "grams of fibre", "milligrams of iron", "milligrams of calcium", "units of vitamin C",
      NULL}},
    {"pet_food", "a pet-food start-up designing a daily bowl for a large dog", "ingredient", "ingredients",
     "100 g", "dollars",
     {"lamb meal", "brown rice", "sweet potato", "pea protein", "fish oil", "carrot", "egg powder", "pumpkin", NULL},
     {"grams of protein", "grams of fat", "units of energy", "milligrams of zinc", "grams of fibre", NULL}},
    {"expedition_rations", "an expedition team packing one person's daily ration", "item", "items", "pack",
     "dollars",
     {"trail mix", "jerky", "oat bar", "dried fruit", "peanut butter", "instant noodles", "powdered milk",
      "chocolate", NULL},
     {"units of energy", "grams of protein", "grams of fat", "grams of carbohydrate", "milligrams of sodium",
      NULL}},
    {"fish_farm", "a fish farm mixing feed for one pen per day", "feed component", "feed components", "kg",
     "dollars",
     {"fish meal", "krill meal", "soy concentrate", "wheat gluten", "algae oil", "corn gluten", "pea meal", NULL},
     {"units of protein", "units of lipid", "units of omega-3", "units of energy", NULL}},
};

static void build_diet(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const diet_skin *sk = &OR_PICK(r, diet_skins);
    in->skin = sk->skin;
    int nf = or_tier_n(r, tier, 3, 4, 5, 6, 6, 8), nn = or_tier_n(r, tier, 2, 3, 3, 4, 4, 5);
    bool maxes = tier == 2, integer = tier == 1 && or_rng_unif(r) < 0.4;
    or_set *F = or_add_set(in, "j", "J", sk->food_sg, sk->food_pl, nf);
    nf = or_set_from_list(F, r, sk->foods);
    int nnl = 0;
    while (sk->nutr[nnl])
        nnl++;
    if (nn > nnl)
        nn = nnl;
    or_set *N = or_add_set(in, "i", "I", "nutrient", "nutrients", nn);
    nn = or_set_from_list(N, r, sk->nutr);
    or_param *c = or_add_param(in, "c", "cost", 1, 0, -1);
    or_param *a = or_add_param(in, "a", "content", 2, 0, 1);
    or_param *lo = or_add_param(in, "r", "min_intake", 1, 1, -1);
    or_param *hi = maxes ? or_add_param(in, "R", "max_intake", 1, 1, -1) : NULL;
    double x0[OR_MAX_MEMBERS];
    for (int j = 0; j < nf; j++) {
        c->v[j] = or_round(0.5 + 4.5 * or_rng_unif(r), 2);
        x0[j] = or_rng_int(r, 0, 4);
        for (int i = 0; i < nn; i++)
            OR_P2(a, j, i) = or_rng_unif(r) < 0.15 ? 0 : or_rng_int(r, 1, 30);
    }
    x0[or_rng_int(r, 0, nf - 1)] += 1;
    for (int i = 0; i < nn; i++) {
        double tot = 0;
        for (int j = 0; j < nf; j++)
            tot += OR_P2(a, j, i) * x0[j];
        if (tot < 5) { /* make sure every nutrient is provided by the reference mix */
            int j = or_rng_int(r, 0, nf - 1);
            if (OR_P2(a, j, i) == 0)
                OR_P2(a, j, i) = or_rng_int(r, 5, 20);
            if (x0[j] == 0)
                x0[j] = 1;
            tot = 0;
            for (int k = 0; k < nf; k++)
                tot += OR_P2(a, k, i) * x0[k];
            for (int k = 0; k < i; k++) { /* earlier requirements only get easier: x0 grew */
            }
        }
        lo->v[i] = floor(0.9 * tot);
        if (hi)
            hi->v[i] = ceil(1.2 * tot) + 5;
    }
    /* recompute after any x0 change so that every bound holds for the reference mix */
    for (int i = 0; i < nn; i++) {
        double tot = 0;
        for (int j = 0; j < nf; j++)
            tot += OR_P2(a, j, i) * x0[j];
        if (lo->v[i] > 0.9 * tot)
            lo->v[i] = floor(0.9 * tot);
        if (hi && hi->v[i] < tot)
            hi->v[i] = ceil(1.2 * tot) + 5;
    }
    STRF(c->desc, "cost of one %s of %s j (%s)", sk->portion, sk->food_sg, sk->money);
    STRF(c->header, "cost per %s (%s)", sk->portion, sk->money);
    STRF(c->unit, "%s", sk->money);
    STRF(c->sent, "One %s of {i} costs {v} {u}.", sk->portion);
    STRF(c->list_pre, "Costs per %s, in %s, are ", sk->portion, sk->money);
    STRF(c->list_elem, "{v} for {i}");
    STRF(a->desc, "amount of nutrient i in one %s of %s j", sk->portion, sk->food_sg);
    STRF(a->row_pre, "One %s of {i} provides ", sk->portion);
    STRF(a->row_elem, "{v} {j}");
    STRF(lo->desc, "minimum daily amount of nutrient i");
    STRF(lo->header, "minimum");
    STRF(lo->sent, "The ration must supply at least {v} {i}.");
    STRF(lo->list_pre, "The minimum requirements are ");
    STRF(lo->list_elem, "{v} {i}");
    if (hi) {
        STRF(hi->desc, "maximum daily amount of nutrient i");
        STRF(hi->header, "maximum");
        STRF(hi->sent, "It must not supply more than {v} {i}.");
        STRF(hi->list_pre, "To avoid excess, the ration may contain at most ");
        STRF(hi->list_elem, "{v} {i}");
    }
    char d[96];
    STRF(d, "%ss of %s j in the ration", sk->portion, sk->food_sg);
    or_add_vfam(in, "x", "j", integer ? "integer, >= 0" : "continuous, >= 0", d);
    or_add_cfam(in, "nutrient_min", true, "\\sum_{j} a_{ji} x_{j} \\ge r_{i} \\quad \\forall i",
                "each nutrient requirement must be met");
    if (hi)
        or_add_cfam(in, "nutrient_max", true, "\\sum_{j} a_{ji} x_{j} \\le R_{i} \\quad \\forall i",
                    "no nutrient may exceed its upper limit");
    STRF(in->obj_math, "\\min \\sum_{j} c_{j} x_{j}");
    STRF(in->obj_desc, "total cost of the ration");
    STRF(in->obj_noun, "daily cost (%s)", sk->money);
    char flist[400];
    or_join_labels(F, flist, sizeof flist);
    STRF(in->intro, "Consider %s. The available %s are %s.", sk->who, sk->food_pl, flist);
    in->intro[0] = 'C';
    STRF(in->rules, "The ration has to meet every nutritional requirement%s, and it should be as cheap as "
                    "possible.",
         hi ? " without going over the stated upper limits" : "");
    if (integer)
        STRF(in->integrality, "Only whole %ss can be used, so each amount must be an integer.", sk->portion);
    else
        STRF(in->integrality, "Amounts may be fractional.");
    STRF(in->ask, "What is the cheapest ration, and what does it cost?");
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    char nm[40];
    for (int j = 0; j < nf; j++) {
        STRF(nm, "x_%d", j + 1);
        STRF(d, "%ss of %s", sk->portion, F->label[j]);
        or_col(in, nm, 0, INFINITY, c->v[j], integer ? TREX_OR_INT : TREX_OR_CONT, d);
    }
    for (int pass = 0; pass < (hi ? 2 : 1); pass++)
        for (int i = 0; i < nn; i++) {
            int n = 0;
            for (int j = 0; j < nf; j++)
                if (OR_P2(a, j, i) != 0) {
                    cols[n] = j;
                    co[n++] = OR_P2(a, j, i);
                }
            STRF(nm, "%s_%d", pass ? "nmax" : "nmin", i + 1);
            STRF(d, "%s requirement for %s", pass ? "upper" : "minimum", N->label[i]);
            or_row(in, nm, pass ? "nutrient_max" : "nutrient_min", n, cols, co, pass ? 'L' : 'G',
                   pass ? hi->v[i] : lo->v[i], d);
        }
}

/* ---------------- blending ---------------- */
typedef struct blend_skin {
    const char *skin, *org, *product, *input_sg, *input_pl, *qty, *money;
    const char *inputs[10];
    const char *attrs[6];
} blend_skin;

static const blend_skin blend_skins[] = {
    {"steel_alloy", "a foundry", "a batch of alloy steel", "scrap grade", "scrap grades", "tonnes", "dollars",
     {"heavy melt scrap", "shredded scrap", "pig iron", "ferrochrome", "busheling scrap", "cast iron borings",
      "stainless revert", NULL},
     {"carbon", "chromium", "manganese", NULL}},
    {"fuel", "a refinery", "a gasoline blend", "component", "components", "barrels", "dollars",
     {"reformate", "alkylate", "FCC naphtha", "isomerate", "butane", "straight-run naphtha", "ethanol", NULL},
     {"aromatics", "olefins", "oxygenate", NULL}},
    {"fertiliser", "a fertiliser plant", "a lot of compound fertiliser", "raw material", "raw materials", "tonnes",
     "euros",
     {"urea", "ammonium nitrate", "diammonium phosphate", "potash", "superphosphate", "ammonium sulphate", NULL},
     {"nitrogen", "phosphate", "potassium", NULL}},
    {"tea", "a tea company", "a lot of house blend", "leaf grade", "leaf grades", "kg", "pounds",
     {"Assam broken leaf", "Ceylon orange pekoe", "Kenyan fannings", "Darjeeling second flush", "Yunnan black",
      "Nilgiri dust", NULL},
     {"tannin", "caffeine", "moisture", NULL}},
};

static void build_blending(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const blend_skin *sk = &OR_PICK(r, blend_skins);
    in->skin = sk->skin;
    int ni = or_tier_n(r, tier, 3, 4, 4, 5, 5, 6), nk = or_tier_n(r, tier, 1, 2, 2, 2, 2, 3);
    or_set *I = or_add_set(in, "j", "J", sk->input_sg, sk->input_pl, ni);
    ni = or_set_from_list(I, r, sk->inputs);
    or_set *K = or_add_set(in, "k", "K", "property", "properties", nk);
    nk = or_set_from_list(K, r, sk->attrs);
    or_param *c = or_add_param(in, "c", "cost", 1, 0, -1);
    or_param *av = or_add_param(in, "s", "available", 1, 0, -1);
    or_param *q = or_add_param(in, "q", "percent", 2, 0, 1);
    or_param *lo = or_add_param(in, "l", "min_percent", 1, 1, -1);
    or_param *hi = or_add_param(in, "h", "max_percent", 1, 1, -1);
    or_param *T = or_add_param(in, "T", "total", 0, -1, -1);
    int qt[OR_MAX_MEMBERS][OR_MAX_SETS]; /* tenths of a percent */
    double w[OR_MAX_MEMBERS], ws = 0;
    T->v[0] = 10 * or_rng_int(r, 10, 60);
    for (int j = 0; j < ni; j++) {
        c->v[j] = or_rng_int(r, 20, 140);
        w[j] = 0.2 + or_rng_unif(r);
        ws += w[j];
        for (int k = 0; k < nk; k++) {
            qt[j][k] = or_rng_int(r, 5, 120);
            OR_P2(q, j, k) = qt[j][k] / 10.0;
        }
    }
    int lot[OR_MAX_SETS], hit[OR_MAX_SETS];
    for (int k = 0; k < nk; k++) {
        double avg = 0;
        for (int j = 0; j < ni; j++)
            avg += w[j] / ws * qt[j][k];
        lot[k] = (int)floor(avg * (0.85 + 0.1 * or_rng_unif(r)));
        hit[k] = (int)ceil(avg * (1.05 + 0.1 * or_rng_unif(r)));
        if (hit[k] <= lot[k])
            hit[k] = lot[k] + 1;
        lo->v[k] = lot[k] / 10.0;
        hi->v[k] = hit[k] / 10.0;
    }
    for (int j = 0; j < ni; j++)
        av->v[j] = ceil(w[j] / ws * T->v[0] * (1.3 + 0.8 * or_rng_unif(r)));
    STRF(c->desc, "cost per unit of %s j (%s per %s)", sk->input_sg, sk->money, sk->qty);
    STRF(c->header, "cost (%s per unit)", sk->money);
    STRF(c->sent, "{i} costs {v} %s per unit.", sk->money);
    STRF(c->list_pre, "Unit costs, in %s, are ", sk->money);
    STRF(c->list_elem, "{v} for {i}");
    STRF(av->desc, "amount of %s j available (%s)", sk->input_sg, sk->qty);
    STRF(av->header, "available (%s)", sk->qty);
    STRF(av->sent, "Only {v} %s of {i} are on hand.", sk->qty);
    STRF(av->list_pre, "Stocks on hand are ");
    STRF(av->list_elem, "{v} %s of {i}", sk->qty);
    STRF(q->desc, "percentage of property k in %s j", sk->input_sg);
    STRF(q->row_pre, "{i} contains ");
    STRF(q->row_elem, "{v} percent {j}");
    STRF(lo->desc, "minimum percentage of property k in the blend");
    STRF(lo->header, "min percent");
    STRF(lo->sent, "The blend must contain at least {v} percent {i}.");
    STRF(lo->list_pre, "Specification minimums are ");
    STRF(lo->list_elem, "{v} percent {i}");
    STRF(hi->desc, "maximum percentage of property k in the blend");
    STRF(hi->header, "max percent");
    STRF(hi->sent, "The blend may contain at most {v} percent {i}.");
    STRF(hi->list_pre, "Specification maximums are ");
    STRF(hi->list_elem, "{v} percent {i}");
    STRF(T->desc, "total amount to produce (%s)", sk->qty);
    STRF(T->sent, "Exactly {v} %s must be produced.", sk->qty);
    char d[96];
    STRF(d, "%s of %s j in the blend", sk->qty, sk->input_sg);
    or_add_vfam(in, "x", "j", "continuous, >= 0", d);
    or_add_cfam(in, "total_output", true, "\\sum_{j} x_{j} = T", "the batch size is fixed");
    or_add_cfam(in, "availability", true, "x_{j} \\le s_{j} \\quad \\forall j", "no input can be used beyond its "
                                                                                "stock");
    or_add_cfam(in, "spec_min", true, "\\sum_{j} (q_{jk} - l_{k}) x_{j} \\ge 0 \\quad \\forall k",
                "the average content of each property is at least its minimum (the ratio written linearly)");
    or_add_cfam(in, "spec_max", true, "\\sum_{j} (q_{jk} - h_{k}) x_{j} \\le 0 \\quad \\forall k",
                "the average content of each property is at most its maximum (linearised ratio)");
    STRF(in->obj_math, "\\min \\sum_{j} c_{j} x_{j}");
    STRF(in->obj_desc, "total cost of the inputs");
    STRF(in->obj_noun, "total cost (%s)", sk->money);
    char ilist[400];
    or_join_labels(I, ilist, sizeof ilist);
    STRF(in->intro, "A planner at %s is preparing %s from these %s: %s.", sk->org, sk->product, sk->input_pl, ilist);
    STRF(in->rules, "Each property of the finished blend is the weighted average of the inputs' percentages and "
                    "must lie between the specification minimum and maximum. The planner wants the cheapest "
                    "blend that meets the specification.");
    STRF(in->integrality, "Input amounts may be fractional.");
    STRF(in->ask, "How much of each %s should go into the blend, and what is the minimum total cost?",
         sk->input_sg);
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    char nm[40];
    for (int j = 0; j < ni; j++) {
        STRF(nm, "x_%d", j + 1);
        STRF(d, "%s of %s used", sk->qty, I->label[j]);
        cols[j] = or_col(in, nm, 0, INFINITY, c->v[j], TREX_OR_CONT, d);
        co[j] = 1;
    }
    or_row(in, "total", "total_output", ni, cols, co, 'E', T->v[0], "batch size");
    for (int j = 0; j < ni; j++) {
        double one = 1;
        STRF(nm, "avail_%d", j + 1);
        STRF(d, "stock of %s", I->label[j]);
        or_row(in, nm, "availability", 1, &j, &one, 'L', av->v[j], d);
    }
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < nk; k++) {
            int n = 0;
            for (int j = 0; j < ni; j++) {
                int diff = qt[j][k] - (pass ? hit[k] : lot[k]);
                if (diff) {
                    cols[n] = j;
                    co[n++] = diff / 10.0;
                }
            }
            if (n == 0)
                continue;
            STRF(nm, "%s_%d", pass ? "spec_max" : "spec_min", k + 1);
            STRF(d, "%s %s content", pass ? "maximum" : "minimum", K->label[k]);
            or_row(in, nm, pass ? "spec_max" : "spec_min", n, cols, co, pass ? 'L' : 'G', 0, d);
        }
}

/* ---------------- transportation ---------------- */
typedef struct tr_skin {
    const char *skin, *src_sg, *src_pl, *dst_sg, *dst_pl, *unit, *money, *goods;
} tr_skin;

static const tr_skin tr_skins[] = {
    {"coffee", "roastery", "roasteries", "cafe", "cafes", "bags", "dollars", "roasted coffee"},
    {"blood_bank", "blood bank", "blood banks", "hospital", "hospitals", "units", "dollars", "blood"},
    {"aggregates", "quarry", "quarries", "building site", "building sites", "tonnes", "euros", "gravel"},
    {"bakery", "bakery", "bakeries", "supermarket", "supermarkets", "crates", "dollars", "bread"},
    {"water", "treatment plant", "treatment plants", "town", "towns", "megalitres", "dollars", "drinking water"},
    {"retail", "warehouse", "warehouses", "store", "stores", "pallets", "pounds", "stock"},
    {"vaccines", "cold store", "cold stores", "clinic", "clinics", "boxes", "dollars", "vaccine doses"},
};

static void build_transportation(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const tr_skin *sk = &OR_PICK(r, tr_skins);
    in->skin = sk->skin;
    int ns = or_tier_n(r, tier, 2, 2, 3, 3, 4, 5), nd = or_tier_n(r, tier, 3, 3, 4, 5, 5, 7);
    bool integer = or_rng_unif(r) < 0.3;
    or_set *S = or_add_set(in, "i", "I", sk->src_sg, sk->src_pl, ns);
    or_set *D = or_add_set(in, "j", "J", sk->dst_sg, sk->dst_pl, nd);
    or_set_labels(S, r, or_place_names, or_nplace_names, NULL);
    or_set_labels(D, r, or_place_names + 21, or_nplace_names - 21, NULL);
    or_param *s = or_add_param(in, "s", "supply", 1, 0, -1);
    or_param *dm = or_add_param(in, "d", "demand", 1, 1, -1);
    or_param *c = or_add_param(in, "c", "cost", 2, 0, 1);
    double tot = 0;
    for (int j = 0; j < nd; j++)
        tot += dm->v[j] = 5 * or_rng_int(r, 4, 30);
    double slack = 1.0 + 0.3 * or_rng_unif(r), left = ceil(tot * slack);
    for (int i = 0; i < ns; i++) {
        double share = i == ns - 1 ? left : floor(left * (0.6 + 0.8 * or_rng_unif(r)) / (ns - i));
        s->v[i] = share;
        left -= share;
    }
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < nd; j++)
            OR_P2(c, i, j) = or_rng_int(r, 2, 25);
    STRF(s->desc, "supply available at %s i (%s)", sk->src_sg, sk->unit);
    STRF(s->header, "supply (%s)", sk->unit);
    STRF(s->sent, "The %s in {i} can ship at most {v} %s.", sk->src_sg, sk->unit);
    STRF(s->list_pre, "Available supply is ");
    STRF(s->list_elem, "{v} %s at {i}", sk->unit);
    STRF(dm->desc, "demand of %s j (%s)", sk->dst_sg, sk->unit);
    STRF(dm->header, "demand (%s)", sk->unit);
    STRF(dm->sent, "The %s in {i} needs exactly {v} %s.", sk->dst_sg, sk->unit);
    STRF(dm->list_pre, "The %s need ", sk->dst_pl);
    STRF(dm->list_elem, "{v} %s in {i}", sk->unit);
    STRF(c->desc, "cost of moving one unit from %s i to %s j (%s)", sk->src_sg, sk->dst_sg, sk->money);
    STRF(c->row_pre, "Shipping one unit from {i} costs ");
    STRF(c->row_elem, "{v} %s to {j}", sk->money);
    or_add_vfam(in, "x", "i,j", integer ? "integer, >= 0" : "continuous, >= 0", "amount shipped from i to j");
    or_add_cfam(in, "supply_cap", true, "\\sum_{j} x_{ij} \\le s_{i} \\quad \\forall i",
                "no source ships more than it has");
    or_add_cfam(in, "demand_meet", true, "\\sum_{i} x_{ij} = d_{j} \\quad \\forall j",
                "every destination receives exactly its demand");
    STRF(in->obj_math, "\\min \\sum_{i}\\sum_{j} c_{ij} x_{ij}");
    STRF(in->obj_desc, "total shipping cost");
    STRF(in->obj_noun, "total shipping cost (%s)", sk->money);
    char sl[400], dl[400];
    or_join_labels(S, sl, sizeof sl);
    or_join_labels(D, dl, sizeof dl);
    STRF(in->intro, "A distributor moves %s from %s in %s to %s in %s.", sk->goods, sk->src_pl, sl, sk->dst_pl, dl);
    STRF(in->rules, "Every %s must receive exactly what it asked for, and no %s may ship more than its supply. "
                    "The distributor wants to meet all demand at the lowest shipping cost.",
         sk->dst_sg, sk->src_sg);
    if (integer)
        STRF(in->integrality, "Shipments are made in whole %s, so every amount must be an integer.", sk->unit);
    else
        STRF(in->integrality, "Shipment amounts may be fractional.");
    STRF(in->ask, "How much should be shipped on each route, and what is the minimum total shipping cost?");
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    char nm[40], d[96];
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < nd; j++) {
            STRF(nm, "x_%d_%d", i + 1, j + 1);
            STRF(d, "%s shipped from %s to %s", sk->unit, S->label[i], D->label[j]);
            or_col(in, nm, 0, INFINITY, OR_P2(c, i, j), integer ? TREX_OR_INT : TREX_OR_CONT, d);
        }
    for (int i = 0; i < ns; i++) {
        for (int j = 0; j < nd; j++) {
            cols[j] = i * nd + j;
            co[j] = 1;
        }
        STRF(nm, "supply_%d", i + 1);
        STRF(d, "supply at %s", S->label[i]);
        or_row(in, nm, "supply_cap", nd, cols, co, 'L', s->v[i], d);
    }
    for (int j = 0; j < nd; j++) {
        for (int i = 0; i < ns; i++) {
            cols[i] = i * nd + j;
            co[i] = 1;
        }
        STRF(nm, "demand_%d", j + 1);
        STRF(d, "demand of %s", D->label[j]);
        or_row(in, nm, "demand_meet", ns, cols, co, 'E', dm->v[j], d);
    }
}

/* ---------------- assignment ---------------- */
typedef struct as_skin {
    const char *skin, *agent_sg, *agent_pl, *task_sg, *task_pl, *measure, *unit;
    const char *tasks[12];
} as_skin;

static const as_skin as_skins[] = {
    {"translation", "translator", "translators", "document", "documents", "time", "hours",
     {"the contract", "the user manual", "the press release", "the patent filing", "the website copy",
      "the annual report", "the safety sheet", "the grant proposal", NULL}},
    {"machining", "machine", "machines", "job", "jobs", "processing cost", "dollars",
     {"the gear housing", "the pump shaft", "the valve body", "the bracket", "the flange", "the rotor",
      "the spindle", "the coupling", NULL}},
    {"delivery", "driver", "drivers", "route", "routes", "cost", "dollars",
     {"the harbour route", "the airport route", "the north loop", "the market run", "the hospital run",
      "the campus loop", "the industrial park run", "the river road", NULL}},
    {"consulting", "consultant", "consultants", "client project", "client projects", "cost", "thousand euros",
     {"the audit", "the migration", "the pricing study", "the supply review", "the risk review",
      "the data cleanup", "the training plan", "the market scan", NULL}},
    {"nursing", "nurse", "nurses", "ward", "wards", "disutility score", "points",
     {"the cardiology ward", "the maternity ward", "the surgical ward", "the children's ward", "the ICU",
      "the emergency bay", "the oncology ward", "the recovery unit", NULL}},
};

static void build_assignment(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const as_skin *sk = &OR_PICK(r, as_skins);
    in->skin = sk->skin;
    int nt = or_tier_n(r, tier, 3, 3, 4, 5, 6, 7);
    int na = tier == 2 ? nt + or_rng_int(r, 0, 2) : nt;
    or_set *A = or_add_set(in, "i", "I", sk->agent_sg, sk->agent_pl, na);
    or_set_labels(A, r, or_person_names, or_nperson_names, NULL);
    or_set *T = or_add_set(in, "j", "J", sk->task_sg, sk->task_pl, nt);
    nt = or_set_from_list(T, r, sk->tasks);
    or_param *c = or_add_param(in, "c", "cost", 2, 0, 1);
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nt; j++)
            OR_P2(c, i, j) = or_rng_int(r, 3, 40);
    STRF(c->desc, "%s (%s) when %s i handles %s j", sk->measure, sk->unit, sk->agent_sg, sk->task_sg);
    STRF(c->row_pre, "For {i}, the %s is ", sk->measure);
    STRF(c->row_elem, "{v} for {j}");
    or_add_vfam(in, "x", "i,j", "binary", "1 if agent i is given task j");
    or_add_cfam(in, "one_per_task", true, "\\sum_{i} x_{ij} = 1 \\quad \\forall j", "each task gets one agent");
    or_add_cfam(in, "one_per_agent", true, "\\sum_{j} x_{ij} \\le 1 \\quad \\forall i",
                "no agent takes more than one task");
    STRF(in->obj_math, "\\min \\sum_{i}\\sum_{j} c_{ij} x_{ij}");
    STRF(in->obj_desc, "total %s", sk->measure);
    STRF(in->obj_noun, "total %s (%s)", sk->measure, sk->unit);
    char al[400], tl[400];
    or_join_labels(A, al, sizeof al);
    or_join_labels(T, tl, sizeof tl);
    STRF(in->intro, "A coordinator must give each of the %s (%s) to one of the %s: %s.", sk->task_pl, tl,
         sk->agent_pl, al);
    STRF(in->rules, "Every %s must be handled by exactly one %s, and no %s can take more than one %s%s. The "
                    "coordinator wants the assignment with the smallest total %s.",
         sk->task_sg, sk->agent_sg, sk->agent_sg, sk->task_sg, na > nt ? "; some may be left without one" : "",
         sk->measure);
    STRF(in->integrality, "Each assignment is a yes-or-no decision.");
    STRF(in->ask, "Who should handle which %s, and what is the minimum total %s?", sk->task_sg, sk->measure);
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    char nm[40], d[96];
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nt; j++) {
            STRF(nm, "x_%d_%d", i + 1, j + 1);
            STRF(d, "%s handles %s", A->label[i], T->label[j]);
            or_col(in, nm, 0, 1, OR_P2(c, i, j), TREX_OR_BIN, d);
        }
    for (int j = 0; j < nt; j++) {
        for (int i = 0; i < na; i++) {
            cols[i] = i * nt + j;
            co[i] = 1;
        }
        STRF(nm, "task_%d", j + 1);
        STRF(d, "%s is covered", T->label[j]);
        or_row(in, nm, "one_per_task", na, cols, co, 'E', 1, d);
    }
    for (int i = 0; i < na; i++) {
        for (int j = 0; j < nt; j++) {
            cols[j] = i * nt + j;
            co[j] = 1;
        }
        STRF(nm, "agent_%d", i + 1);
        STRF(d, "%s takes at most one", A->label[i]);
        or_row(in, nm, "one_per_agent", nt, cols, co, 'L', 1, d);
    }
}

/* ---------------- knapsack / capital budgeting ---------------- */
typedef struct ks_skin {
    const char *skin, *who, *item_sg, *item_pl, *value, *vunit, *weight, *wunit;
    const char *items[16];
} ks_skin;

static const ks_skin ks_skins[] = {
    {"capital_budget", "a city council", "project", "projects", "net present value", "thousand dollars", "cost",
     "thousand dollars",
     {"the library upgrade", "the bike lanes", "the solar roofs", "the park renovation", "the flood barrier",
      "the transit app", "the LED streetlights", "the community pool", "the youth centre", "the bridge repair",
      "the water meters", "the market hall", NULL}},
    {"cargo", "a cargo pilot", "crate", "crates", "value", "dollars", "weight", "kg",
     {"the medical kits", "the radio parts", "the seed stock", "the water filters", "the tools", "the batteries",
      "the tents", "the generators", "the books", "the solar lamps", "the spare tyres", NULL}},
    {"marketing", "a marketing team", "campaign", "campaigns", "expected reach", "thousand people", "cost",
     "thousand euros",
     {"the radio spots", "the podcast ads", "the billboard run", "the influencer series", "the search ads",
      "the newsletter push", "the trade show", "the cinema ads", "the bus wraps", "the video series", NULL}},
    {"research", "a research foundation", "proposal", "proposals", "review score", "points", "requested budget",
     "thousand dollars",
     {"the battery study", "the malaria trial", "the soil survey", "the coral project", "the AI audit",
      "the vaccine study", "the glacier survey", "the literacy trial", "the grid study", "the bee census", NULL}},
};

static void build_knapsack(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MAX;
    const ks_skin *sk = &OR_PICK(r, ks_skins);
    in->skin = sk->skin;
    int n = or_tier_n(r, tier, 4, 5, 6, 8, 8, 10);
    or_set *I = or_add_set(in, "j", "J", sk->item_sg, sk->item_pl, n);
    n = or_set_from_list(I, r, sk->items);
    or_param *v = or_add_param(in, "v", "value", 1, 0, -1);
    or_param *w = or_add_param(in, "w", "weight", 1, 0, -1);
    or_param *W = or_add_param(in, "W", "capacity", 0, -1, -1);
    double sw = 0;
    for (int j = 0; j < n; j++) {
        w->v[j] = or_rng_int(r, 5, 60);
        v->v[j] = floor(w->v[j] * (0.6 + 1.2 * or_rng_unif(r))) + or_rng_int(r, 1, 10);
        sw += w->v[j];
    }
    W->v[0] = floor(sw * (0.3 + 0.4 * or_rng_unif(r)));
    int c1 = -1, c2 = -1, p1 = -1, p2 = -1;
    if (tier >= 1) {
        c1 = or_rng_int(r, 0, n - 1);
        do
            c2 = or_rng_int(r, 0, n - 1);
        while (c2 == c1);
    }
    if (tier == 2) {
        do
            p1 = or_rng_int(r, 0, n - 1);
        while (p1 == c1 || p1 == c2);
        do
            p2 = or_rng_int(r, 0, n - 1);
        while (p2 == p1);
    }
    STRF(v->desc, "%s of %s j (%s)", sk->value, sk->item_sg, sk->vunit);
    STRF(v->header, "%s (%s)", sk->value, sk->vunit);
    STRF(v->sent, "{i} has a %s of {v} %s.", sk->value, sk->vunit);
    STRF(v->list_pre, "The %s figures, in %s, are ", sk->value, sk->vunit);
    STRF(v->list_elem, "{v} for {i}");
    STRF(w->desc, "%s of %s j (%s)", sk->weight, sk->item_sg, sk->wunit);
    STRF(w->header, "%s (%s)", sk->weight, sk->wunit);
    STRF(w->sent, "{i} has a %s of {v} %s.", sk->weight, sk->wunit);
    STRF(w->list_pre, "The %s figures, in %s, are ", sk->weight, sk->wunit);
    STRF(w->list_elem, "{v} for {i}");
    STRF(W->desc, "limit on the total %s (%s)", sk->weight, sk->wunit);
    STRF(W->sent, "The total %s of the chosen %s may not exceed {v} %s.", sk->weight, sk->item_pl, sk->wunit);
    or_add_vfam(in, "y", "j", "binary", "1 if item j is chosen");
    or_add_cfam(in, "capacity", true, "\\sum_{j} w_{j} y_{j} \\le W", "the chosen items fit the limit");
    if (c1 >= 0)
        or_add_cfam(in, "conflict", true, "y_{a} + y_{b} \\le 1", "two items exclude each other");
    if (p1 >= 0)
        or_add_cfam(in, "precedence", true, "y_{a} \\le y_{b}", "one item requires another");
    STRF(in->obj_math, "\\max \\sum_{j} v_{j} y_{j}");
    STRF(in->obj_desc, "total %s", sk->value);
    STRF(in->obj_noun, "total %s (%s)", sk->value, sk->vunit);
    char il[600];
    or_join_labels(I, il, sizeof il);
    STRF(in->intro, "Consider %s choosing among these %s: %s.", sk->who, sk->item_pl, il);
    in->intro[0] = 'C';
    or_sb rb = {0};
    or_sb_printf(&rb, "Each %s is either taken whole or left out.", sk->item_sg);
    if (c1 >= 0)
        or_sb_printf(&rb, " %s and %s cannot both be chosen.", I->label[c1], I->label[c2]);
    if (p1 >= 0)
        or_sb_printf(&rb, " %s may only be chosen if %s is chosen too.", I->label[p1], I->label[p2]);
    or_sb_printf(&rb, " The aim is the largest total %s.", sk->value);
    STRF(in->rules, "%s", rb.s);
    or_sb_free(&rb);
    in->rules[0] = (char)(in->rules[0] >= 'a' && in->rules[0] <= 'z' ? in->rules[0] - 32 : in->rules[0]);
    STRF(in->integrality, "Every choice is a yes-or-no decision.");
    STRF(in->ask, "Which %s should be chosen, and what total %s do they give?", sk->item_pl, sk->value);
    int cols[OR_MAX_MEMBERS];
    double co[OR_MAX_MEMBERS];
    char nm[40], d[96];
    for (int j = 0; j < n; j++) {
        STRF(nm, "y_%d", j + 1);
        STRF(d, "choose %s", I->label[j]);
        cols[j] = or_col(in, nm, 0, 1, v->v[j], TREX_OR_BIN, d);
        co[j] = w->v[j];
    }
    or_row(in, "capacity", "capacity", n, cols, co, 'L', W->v[0], "total limit");
    if (c1 >= 0) {
        int cc[2] = {c1, c2};
        double o[2] = {1, 1};
        or_row(in, "conflict_1", "conflict", 2, cc, o, 'L', 1, "mutual exclusion");
    }
    if (p1 >= 0) {
        int cc[2] = {p1, p2};
        double o[2] = {1, -1};
        or_row(in, "prec_1", "precedence", 2, cc, o, 'L', 0, "requirement link");
    }
}

/* ---------------- capacitated facility location ---------------- */
typedef struct fl_skin {
    const char *skin, *fac_sg, *fac_pl, *cus_sg, *cus_pl, *unit, *money;
} fl_skin;

static const fl_skin fl_skins[] = {
    {"distribution", "distribution centre", "distribution centres", "retail region", "retail regions", "pallets",
     "dollars"},
    {"cold_chain", "cold-chain hub", "cold-chain hubs", "clinic", "clinics", "boxes", "dollars"},
    {"recycling", "sorting plant", "sorting plants", "municipality", "municipalities", "tonnes", "euros"},
    {"grain", "silo", "silos", "farm cooperative", "farm cooperatives", "tonnes", "dollars"},
    {"parcels", "parcel depot", "parcel depots", "postcode area", "postcode areas", "parcels (hundreds)",
     "pounds"},
};

static void build_facility(or_inst *in, int tier, or_rng *r)
{
    in->m.sense = TREX_OR_MIN;
    const fl_skin *sk = &OR_PICK(r, fl_skins);
    in->skin = sk->skin;
    int nf = or_tier_n(r, tier, 2, 3, 3, 4, 4, 5), nc = or_tier_n(r, tier, 3, 4, 5, 6, 6, 8);
    or_set *F = or_add_set(in, "i", "I", sk->fac_sg, sk->fac_pl, nf);
    or_set *C = or_add_set(in, "j", "J", sk->cus_sg, sk->cus_pl, nc);
    or_set_labels(F, r, or_place_names, 20, NULL);
    or_set_labels(C, r, or_place_names + 20, or_nplace_names - 20, NULL);
    or_param *f = or_add_param(in, "f", "fixed_cost", 1, 0, -1);
    or_param *u = or_add_param(in, "u", "capacity", 1, 0, -1);
    or_param *d = or_add_param(in, "d", "demand", 1, 1, -1);
    or_param *c = or_add_param(in, "c", "unit_cost", 2, 0, 1);
    double D = 0;
    for (int j = 0; j < nc; j++)
        D += d->v[j] = 5 * or_rng_int(r, 3, 20);
    double U = 0;
    for (int i = 0; i < nf; i++)
        U += u->v[i] = 10 * ceil(1.4 * D / nf * (0.7 + 0.6 * or_rng_unif(r)) / 10);
    if (U < 1.3 * D) /* capacity must cover demand with room to choose */
        u->v[nf - 1] += 10 * ceil((1.3 * D - U) / 10);
    double avgc = 0;
    for (int i = 0; i < nf; i++)
        for (int j = 0; j < nc; j++)
            avgc += OR_P2(c, i, j) = or_rng_int(r, 2, 20);
    avgc /= nf * nc;
    for (int i = 0; i < nf; i++)
        f->v[i] = 10 * floor(avgc * D / nf * (0.6 + 0.9 * or_rng_unif(r)) / 10 + 1);
    STRF(f->desc, "fixed cost of opening %s i (%s)", sk->fac_sg, sk->money);
    STRF(f->header, "fixed cost (%s)", sk->money);
    STRF(f->sent, "Opening the %s at {i} costs {v} %s.", sk->fac_sg, sk->money);
    STRF(f->list_pre, "Fixed opening costs, in %s, are ", sk->money);
    STRF(f->list_elem, "{v} at {i}");
    STRF(u->desc, "capacity of %s i (%s)", sk->fac_sg, sk->unit);
    STRF(u->header, "capacity (%s)", sk->unit);
    STRF(u->sent, "If opened, the %s at {i} can handle up to {v} %s.", sk->fac_sg, sk->unit);
    STRF(u->list_pre, "Capacities are ");
    STRF(u->list_elem, "{v} %s at {i}", sk->unit);
    STRF(d->desc, "demand of %s j (%s)", sk->cus_sg, sk->unit);
    STRF(d->header, "demand (%s)", sk->unit);
    STRF(d->sent, "{i} needs {v} %s.", sk->unit);
    STRF(d->list_pre, "Demands are ");
    STRF(d->list_elem, "{v} %s for {i}", sk->unit);
    STRF(c->desc, "cost of serving one unit of j's demand from i (%s)", sk->money);
    STRF(c->row_pre, "From {i}, one unit costs ");
    STRF(c->row_elem, "{v} %s to reach {j}", sk->money);
    or_add_vfam(in, "y", "i", "binary", "1 if facility i is opened");
    or_add_vfam(in, "x", "i,j", "continuous, >= 0", "amount sent from i to j");
    or_add_cfam(in, "demand_meet", true, "\\sum_{i} x_{ij} = d_{j} \\quad \\forall j", "all demand is served");
    or_add_cfam(in, "capacity_link", true, "\\sum_{j} x_{ij} \\le u_{i} y_{i} \\quad \\forall i",
                "a closed site ships nothing and an open one ships at most its capacity");
    or_add_cfam(in, "open_before_ship", true, "x_{ij} \\le \\min(u_{i}, d_{j})\\, y_{i} \\quad \\forall i,j",
                "a tight per-route link (big-M taken from the data, never an arbitrary large constant)");
    STRF(in->obj_math, "\\min \\sum_{i} f_{i} y_{i} + \\sum_{i}\\sum_{j} c_{ij} x_{ij}");
    STRF(in->obj_desc, "fixed opening costs plus delivery costs");
    STRF(in->obj_noun, "total cost (%s)", sk->money);
    char fl[400], cl[400];
    or_join_labels(F, fl, sizeof fl);
    or_join_labels(C, cl, sizeof cl);
    STRF(in->intro, "A company may open %s at %s to serve the %s %s.", sk->fac_pl, fl, sk->cus_pl, cl);
    STRF(in->rules, "Each %s's demand must be met in full, possibly from several open sites. A site that is not "
                    "opened cannot ship anything, and an open one cannot exceed its capacity. The company wants to "
                    "minimise the opening costs plus the delivery costs.",
         sk->cus_sg);
    STRF(in->integrality, "Opening a site is a yes-or-no decision; shipped amounts may be fractional.");
    STRF(in->ask, "Which sites should be opened, how should demand be served, and what is the minimum total "
                  "cost?");
    int cols[OR_MAX_MEMBERS + 1];
    double co[OR_MAX_MEMBERS + 1];
    char nm[40], ds[96];
    for (int i = 0; i < nf; i++) {
        STRF(nm, "y_%d", i + 1);
        STRF(ds, "open the %s at %s", sk->fac_sg, F->label[i]);
        or_col(in, nm, 0, 1, f->v[i], TREX_OR_BIN, ds);
    }
    for (int i = 0; i < nf; i++)
        for (int j = 0; j < nc; j++) {
            STRF(nm, "x_%d_%d", i + 1, j + 1);
            STRF(ds, "%s from %s to %s", sk->unit, F->label[i], C->label[j]);
            or_col(in, nm, 0, INFINITY, OR_P2(c, i, j), TREX_OR_CONT, ds);
        }
    for (int j = 0; j < nc; j++) {
        for (int i = 0; i < nf; i++) {
            cols[i] = nf + i * nc + j;
            co[i] = 1;
        }
        STRF(nm, "demand_%d", j + 1);
        STRF(ds, "demand of %s", C->label[j]);
        or_row(in, nm, "demand_meet", nf, cols, co, 'E', d->v[j], ds);
    }
    for (int i = 0; i < nf; i++) {
        for (int j = 0; j < nc; j++) {
            cols[j] = nf + i * nc + j;
            co[j] = 1;
        }
        cols[nc] = i;
        co[nc] = -u->v[i];
        STRF(nm, "cap_%d", i + 1);
        STRF(ds, "capacity of %s", F->label[i]);
        or_row(in, nm, "capacity_link", nc + 1, cols, co, 'L', 0, ds);
    }
    for (int i = 0; i < nf; i++)
        for (int j = 0; j < nc; j++) {
            int cc[2] = {nf + i * nc + j, i};
            double o[2] = {1, -fmin(u->v[i], d->v[j])};
            STRF(nm, "link_%d_%d", i + 1, j + 1);
            STRF(ds, "%s serves %s only if open", F->label[i], C->label[j]);
            or_row(in, nm, "open_before_ship", 2, cc, o, 'L', 0, ds);
        }
}

const or_family or_families_a_tab[] = {
    {"product_mix", "LP/MILP", build_product_mix},
    {"diet", "LP/MILP", build_diet},
    {"blending", "LP", build_blending},
    {"transportation", "LP/MILP", build_transportation},
    {"assignment", "MILP", build_assignment},
    {"knapsack", "MILP", build_knapsack},
    {"facility_location", "MILP", build_facility},
};
const int or_families_a_n = (int)(sizeof or_families_a_tab / sizeof or_families_a_tab[0]);
