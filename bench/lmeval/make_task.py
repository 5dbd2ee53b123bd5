#!/usr/bin/env python3
"""Writes ember_mc.jsonl: the local multiple-choice task lm-evaluation-harness
scores against Ember (bench/run_lmeval.sh). Run from anywhere:

    python3 bench/lmeval/make_task.py

Twenty general-knowledge questions, four choices each, written for this repo
(no data set is downloaded). Each line: {"question", "choices", "answer"}
with `answer` the index of the right choice. The file is committed; this
script is how it was made, and re-running it must reproduce it byte for byte.
"""

import json
import pathlib

ITEMS = [
    ("What is the capital of France?", ["Paris", "Berlin", "Madrid", "Rome"], 0),
    ("How many days are in a week?", ["five", "six", "seven", "eight"], 2),
    ("What color is the sky on a clear day?", ["green", "blue", "red", "black"], 1),
    ("Which animal barks?", ["cat", "cow", "dog", "fish"], 2),
    ("What is two plus two?", ["three", "four", "five", "six"], 1),
    ("Which planet do we live on?", ["Mars", "Venus", "Jupiter", "Earth"], 3),
    ("What do bees make?", ["milk", "honey", "silk", "wool"], 1),
    ("Water freezes into what?", ["ice", "steam", "sand", "glass"], 0),
    ("What is the opposite of hot?", ["warm", "cold", "wet", "loud"], 1),
    ("How many legs does a spider have?", ["four", "six", "eight", "ten"], 2),
    ("Which season comes after winter?", ["spring", "summer", "autumn", "night"], 0),
    ("What is the largest ocean on Earth?", ["Atlantic", "Indian", "Arctic", "Pacific"], 3),
    ("What do you use to write on paper?", ["a pen", "a spoon", "a shoe", "a cup"], 0),
    ("Which month has the fewest days?", ["January", "February", "March", "April"], 1),
    ("What gas do people breathe in to live?", ["oxygen", "helium", "neon", "argon"], 0),
    ("Which is a fruit?", ["carrot", "potato", "apple", "onion"], 2),
    ("What is the capital of Japan?", ["Seoul", "Beijing", "Tokyo", "Bangkok"], 2),
    ("How many hours are in a day?", ["twelve", "twenty", "twenty-four", "sixty"], 2),
    ("Which shape has three sides?", ["square", "triangle", "circle", "hexagon"], 1),
    ("What falls from clouds when it rains?", ["water", "sand", "smoke", "light"], 0),
]


def main() -> None:
    out = pathlib.Path(__file__).with_name("ember_mc.jsonl")
    lines = [
        json.dumps({"question": q, "choices": c, "answer": a}, ensure_ascii=False)
        for q, c, a in ITEMS
    ]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{out}: {len(lines)} items")


if __name__ == "__main__":
    main()
