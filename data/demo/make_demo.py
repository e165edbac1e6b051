#!/usr/bin/env python3
"""Writes the demo corpus of `make demo` (data/demo/): cpt.jsonl (short documents for continued
pre-training and for training the tokenizer) and sft.jsonl (short chat samples, some with reasoning).

Everything is generated from the templates below with a fixed seed, so the files are a function of
this script: `python3 data/demo/make_demo.py data/demo` rewrites them byte for byte. The text is
written for trex; it is deliberately small and regular, so that dsv4-tiny learns it on two CPU cores
in a few minutes. Usage: make_demo.py OUT_DIR [--sft N] [--cpt N]."""
import json
import random
import sys

WORDS = ["apple", "river", "stone", "cloud", "garden", "window", "planet", "forest", "candle", "bridge",
         "silver", "market", "engine", "harbor", "lantern", "meadow", "pencil", "rocket", "saddle", "tunnel",
         "violin", "wagon", "yellow", "zebra", "anchor", "basket", "castle", "dragon", "falcon", "guitar"]
ITEMS = [("chairs", "tables"), ("bikes", "scooters"), ("shirts", "jackets"), ("lamps", "clocks"),
         ("boxes", "crates"), ("cakes", "pies")]
SYSTEMS = ["You are a concise assistant.", "Answer briefly and exactly.", None, None]
NUM = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
       "twelve"]


def sample(rng):
    kind = rng.randrange(9)
    reasoning = None
    if kind == 0:
        a, b = rng.randrange(2, 60), rng.randrange(2, 40)
        q, ans = f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
        if rng.random() < 0.3:
            reasoning = f"Add {a} and {b}: {a} + {b} = {a + b}."
    elif kind == 1:
        a, b = rng.randrange(2, 13), rng.randrange(2, 13)
        q, ans = f"What is {a} times {b}?", f"{a} times {b} is {a * b}."
        if rng.random() < 0.3:
            reasoning = f"Multiply: {a} x {b} = {a * b}."
    elif kind == 2:
        w = rng.choice(WORDS)
        q, ans = f"Reverse the word {w}.", f"The word {w} reversed is {w[::-1]}."
    elif kind == 3:
        a, b = rng.sample(range(1, 200), 2)
        big, small = max(a, b), min(a, b)
        q, ans = f"Which is larger, {a} or {b}?", f"{big} is larger than {small}."
    elif kind == 4:
        (x, y), p, r, n = rng.choice(ITEMS), rng.randrange(2, 9), rng.randrange(2, 9), rng.randrange(4, 30)
        if p == r:
            r += 1
        best, val = (x, p * n) if p > r else (y, r * n)
        q = (f"A shop earns {p} euros per {x[:-1]} and {r} euros per {y[:-1]}. It can make at most {n} items in "
             f"total. How many of each should it make to earn the most?")
        ans = f"Make {n} {best} and none of the others: the profit is {val} euros."
        if rng.random() < 0.5:
            reasoning = (f"One constraint, x + y <= {n}. The objective {p}x + {r}y is largest at a vertex; "
                         f"the better vertex puts all {n} items on {best}.")
    elif kind == 5:
        m = rng.randrange(1, 90)
        q, ans = f"Convert {m} minutes to seconds.", f"{m} minutes are {60 * m} seconds."
    elif kind == 6:
        n = rng.randrange(1, 500)
        q, ans = f"Is {n} even or odd?", f"{n} is {'even' if n % 2 == 0 else 'odd'}."
    elif kind == 7:
        w = rng.choice(WORDS)
        q, ans = f"Spell {w} letter by letter.", "-".join(w) + "."
    else:
        n = rng.randrange(0, 13)
        q, ans = f"Write the number {n} in words.", f"{n} is written {NUM[n]}."
    msgs = []
    sysm = rng.choice(SYSTEMS)
    if sysm:
        msgs.append({"role": "system", "content": sysm})
    msgs.append({"role": "user", "content": q})
    a = {"role": "assistant", "content": ans}
    if reasoning:
        a["reasoning_content"] = reasoning
    msgs.append(a)
    return {"messages": msgs}


PARAGRAPHS = [
    "A linear program chooses values for a few variables so that a linear objective is as large or as small as "
    "possible while linear constraints hold. When a solution exists, one of the corners of the feasible region "
    "is optimal.",
    "The simplex method walks from corner to corner of the feasible region. Each move improves the objective, "
    "and the walk stops at a corner where no neighbour is better.",
    "An integer program adds the rule that some variables take whole values. Branch and bound solves it by "
    "splitting the problem on a fractional variable and pruning branches whose bound cannot beat the best "
    "solution found so far.",
    "A mixture of experts sends each token to a few experts chosen by a router. Only the chosen experts run, "
    "so the model can hold many parameters while each token pays for a small part of them.",
    "Training a language model repeats one step many times: read a batch of text, predict every next token, "
    "measure the error, and move the weights a little against the gradient of that error.",
    "A tokenizer cuts text into pieces from a fixed vocabulary. Byte pair encoding starts from single bytes and "
    "merges the most frequent neighbouring pair again and again until the vocabulary is full.",
]


def document(rng):
    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice(PARAGRAPHS) + " " + rng.choice(PARAGRAPHS)
    if kind == 1:
        parts = []
        for _ in range(rng.randrange(3, 7)):
            a, b = rng.randrange(2, 60), rng.randrange(2, 40)
            parts.append(f"The sum of {a} and {b} is {a + b}.")
        return " ".join(parts)
    if kind == 2:
        ws = rng.sample(WORDS, rng.randrange(3, 6))
        return " ".join(f"Read backwards, {w} becomes {w[::-1]}." for w in ws)
    (x, y), p, r, n = rng.choice(ITEMS), rng.randrange(2, 9), rng.randrange(2, 9), rng.randrange(4, 30)
    return (f"A workshop makes {x} and {y}. Each of the {x} earns {p} euros and each of the {y} earns {r} euros. "
            f"With room for {n} items, the best plan makes only the item that earns more, which gives "
            f"{max(p, r) * n} euros.")


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    out, n_sft, n_cpt = args[0], 320, 600
    if "--sft" in args:
        n_sft = int(args[args.index("--sft") + 1])
    if "--cpt" in args:
        n_cpt = int(args[args.index("--cpt") + 1])
    rng = random.Random(20261130)
    with open(f"{out}/sft.jsonl", "w") as f:
        for _ in range(n_sft):
            f.write(json.dumps(sample(rng), ensure_ascii=False) + "\n")
    with open(f"{out}/cpt.jsonl", "w") as f:
        for _ in range(n_cpt):
            f.write(json.dumps({"text": document(rng)}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
