"""Hand-written (reference, prediction, label) judgements by category, for benchmarks/verifier.py.

Written for this project (not taken from any grader's test-suite) to cover how answers are
written outside rstar2's own format. ``free`` marks a prediction that is a sentence or a whole
solution: only lenient extraction can read it; the others are bare answers, which the strict
benchmark wraps as ``<answer>\\boxed{…}</answer>`` and the lenient one reads as given.
Every category holds wrong predictions too, mostly near misses, so precision is measured where it
is at risk.
"""

from __future__ import annotations

# (reference, prediction, label)
SENTENCE = [
    ("42", "So the total number of apples is 42.", True),
    ("42", "Adding both groups, she has 42 stickers left.", True),
    ("42", "The answer is 43.", False),
    ("\\frac{3}{4}", "The probability is $\\frac{3}{4}$.", True),
    ("\\frac{3}{4}", "Hence the probability equals $\\frac{3}{5}$.", False),
    ("7", "Checking each case, we get $n = 7$.", True),
    ("7", "First we try n = 7, which fails, so n = 8.", False),
    ("12", "We solve 3x = 36.\nx = 12", True),
    ("12", "We solve 3x = 36.\nTherefore x = 12", True),
    ("12", "We solve 3x = 36, x = 13", False),
    ("2\\sqrt{5}", "Using Pythagoras, the distance is $\\sqrt{20} = 2\\sqrt{5}$.", True),
    ("2\\sqrt{5}", "By Pythagoras the length is \\(2\\sqrt{5}\\)", True),
    ("2\\sqrt{5}", "By Pythagoras the length is \\(3\\sqrt{5}\\)", False),
    ("-3", "The other root is 5, so the smallest root is $x=-3$.", True),
    ("15", "Step 1: 3 * 5 = 15.\nStep 2: nothing else is needed.\n15", True),
    ("15", "Step 1: 3 * 5 = 15.\nStep 2: add one.\n16", False),
    ("\\frac{1}{6}", "There are 36 outcomes and 6 favourable ones, so the answer is 1/6.", True),
    ("\\frac{1}{6}", "There are 36 outcomes and 6 favourable ones: 6/36 = 1/6", True),
    ("\\frac{1}{6}", "There are 36 outcomes and 5 favourable ones: 5/36", False),
    ("9", "**Answer:** 9", True),
    ("9", "Final answer: 9", True),
    ("9", "Final answer: 8", False),
    ("100", "The maximum area is $100$ square units, reached when the sides are equal.", True),
    ("100", "The maximum area is $81$ square units, reached when the sides are equal.", False),
    ("\\pi", "Thus the area of the circle is $\\pi$.", True),
    ("\\pi", "Thus the area is $2\\pi$.", False),
    ("256", "We compute 2^8 which is 256", True),
    ("256", "We compute 2^8 which is 255", False),
    ("5", "The number of ways is therefore 5.", True),
    ("x^2+2x+1", "Expanding gives $(x+1)^2 = x^2 + 2x + 1$.", True),
    ("x^2+2x+1", "Expanding gives $x^2 + 2x - 1$.", False),
    ("42", "The final answer is 42. I hope it is correct.", True),
    ("42", "The final answer is 24. I hope it is correct.", False),
    ("2, 3", "So the roots are $x = 2$ and $x = 3$.", True),
    ("2, 3", "So the roots are $x = 2$ and $x = -3$.", False),
    ("7", "The remainder when $2^{100}$ is divided by 9 is 7.", True),
    ("7", "The remainder when $2^{100}$ is divided by 7 is 2.", False),
    ("-2", "x = -2 is the only solution.", True),
    ("3", "Solving, we find that $n$ must be 3.", True),
    ("\\text{Evelyn}", "Comparing the times, the winner is Evelyn.", True),
    ("\\text{Evelyn}", "Comparing the times, the winner is Evenly.", False),
    ("\\frac{1}{2}", "**Final Answer**\n\n$$\\frac{1}{2}$$", True),
    ("\\frac{1}{2}", "**Final Answer**\n\n$$\\frac{1}{3}$$", False),
]

UNITS = [
    ("18", "18 cm", True),
    ("18", "18 \\text{ cm}", True),
    ("18", "18 centimeters", True),
    ("18", "19 cm", False),
    ("36", "36 cm^2", True),
    ("36", "36 \\text{cm}^2", True),
    ("4.5", "\\$4.50", True),
    ("4.5", "$4.50 dollars", True),
    ("4.5", "\\$4.05", False),
    ("12", "12 km/h", True),
    ("12", "12 \\text{ km/h}", True),
    ("12", "12 hours", True),
    ("12", "120 minutes", False),
    ("60", "60 mph", True),
    ("60", "60 degrees", True),
    ("60", "60^{\\circ}", True),
    ("60", "6 degrees", False),
    ("3", "3 apples", True),
    ("3", "3 \\mbox{ apples}", True),
    ("25", "25\\%", True),
    ("25", "25 percent", True),
    ("25", "2.5 percent", False),
    ("7.5", "7.5 kg", True),
    ("7.5", "7.5 \\mathrm{kg}", True),
    ("7.5", "75 kg", False),
]

RELATIONS = [
    ("x \\geq 3", "x >= 3", True),
    ("x \\geq 3", "x \\ge 3", True),
    ("x \\geq 3", "x ≥ 3", True),
    ("x \\geq 3", "x > 3", False),
    ("x \\geq 3", "x \\leq 3", False),
    ("x \\leq -2", "x <= -2", True),
    ("x \\leq -2", "x \\le -2", True),
    ("x \\leq -2", "x < -2", False),
    ("x \\neq 1", "x != 1", True),
    ("x \\neq 1", "x \\ne 1", True),
    ("x \\neq 1", "x \\neq -1", False),
    ("x < 5", "x \\lt 5", True),
    ("x < 5", "x \\leq 5", False),
    ("x > 0", "x \\gt 0", True),
    ("x > 0", "0 < x", True),
    ("x > 0", "x < 0", False),
    ("-1 < x \\leq 4", "-1 \\lt x <= 4", True),
    ("-1 < x \\leq 4", "-1 < x < 4", False),
    ("a \\geq b", "b \\leq a", True),
    ("a \\geq b", "a \\leq b", False),
]

EQUATIONS = [
    ("y = 2x + 3", "x = \\frac{y - 3}{2}", True),
    ("y = 2x + 3", "2x - y + 3 = 0", True),
    ("y = 2x + 3", "y - 2x = 3", True),
    ("y = 2x + 3", "y = 2x - 3", False),
    ("y = 2x + 3", "x = \\frac{y + 3}{2}", False),
    ("2x + 4y = 8", "x + 2y = 4", True),
    ("2x + 4y = 8", "y = 2 - \\frac{x}{2}", True),
    ("2x + 4y = 8", "x + 2y = 8", False),
    ("x^2 + y^2 = 25", "y^2 = 25 - x^2", True),
    ("x^2 + y^2 = 25", "x^2 + y^2 = 5", False),
    ("x^2 + y^2 = 25", "x + y = 5", False),
    ("y = -\\frac{1}{3}x + 2", "x + 3y = 6", True),
    ("y = -\\frac{1}{3}x + 2", "x + 3y = 2", False),
    ("3x - 2y = 12", "y = \\frac{3}{2}x - 6", True),
    ("3x - 2y = 12", "y = \\frac{3}{2}x + 6", False),
    ("z = x + y", "x = z - y", True),
    ("z = x + y", "x = z + y", False),
]

MATRICES = [
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}",
        True,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\left[\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}\\right]",
        True,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\left(\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}\\right)",
        True,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\begin{bmatrix} 1 & 3 \\\\ 2 & 4 \\end{bmatrix}",
        False,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\begin{bmatrix} 1 & 2 \\\\ 3 & 5 \\end{bmatrix}",
        False,
    ),
    (
        "\\begin{pmatrix} \\frac{1}{2} \\\\ -1 \\end{pmatrix}",
        "\\begin{bmatrix} 0.5 \\\\ -1 \\end{bmatrix}",
        True,
    ),
    (
        "\\begin{pmatrix} \\frac{1}{2} \\\\ -1 \\end{pmatrix}",
        "\\begin{bmatrix} -1 \\\\ 0.5 \\end{bmatrix}",
        False,
    ),
    (
        "\\begin{pmatrix} 2 & 0 \\\\ 0 & 2 \\end{pmatrix}",
        "The product is $\\begin{bmatrix} 2 & 0 \\\\ 0 & 2 \\end{bmatrix}$.",
        True,
    ),
    (
        "\\begin{pmatrix} 2 & 0 \\\\ 0 & 2 \\end{pmatrix}",
        "Multiplying, we get \\[\\left[\\begin{array}{cc} 2 & 0 \\\\ 0 & 2 \\end{array}\\right]\\] as the result.",
        True,
    ),
    (
        "\\begin{pmatrix} 2 & 0 \\\\ 0 & 2 \\end{pmatrix}",
        "The product is $\\begin{bmatrix} 2 & 0 \\\\ 0 & -2 \\end{bmatrix}$.",
        False,
    ),
    (
        "\\begin{pmatrix} 3 \\\\ -1 \\\\ 2 \\end{pmatrix}",
        "So the vector is $\\begin{pmatrix} 3 \\\\ -1 \\\\ 2 \\end{pmatrix}$",
        True,
    ),
    (
        "\\begin{pmatrix} 3 \\\\ -1 \\\\ 2 \\end{pmatrix}",
        "So the vector is $\\begin{pmatrix} 3 \\\\ 1 \\\\ 2 \\end{pmatrix}$",
        False,
    ),
]

MULTIPLE = [
    ("2, 3", "x = 2 or x = 3", True),
    ("2, 3", "x = 3 or x = 2", True),
    ("2, 3", "3, 2", True),
    ("2, 3", "2 and 3", True),
    ("2, 3", "x=3, x=2", True),
    ("2, 3", "x \\in \\{2, 3\\}", True),
    ("2, 3", "2; 3", True),
    ("2, 3", "2, 4", False),
    ("2, 3", "2", False),
    ("2, 3", "2, 3, 4", False),
    ("2, 3", "x = 2 or x = -3", False),
    ("1 \\pm \\sqrt{2}", "1 - \\sqrt{2}, 1 + \\sqrt{2}", True),
    ("1 \\pm \\sqrt{2}", "x = 1+\\sqrt2 \\text{ or } x = 1-\\sqrt2", True),
    ("1 \\pm \\sqrt{2}", "1 + \\sqrt{2}", False),
    ("1 \\pm \\sqrt{2}", "-1 \\pm \\sqrt{2}", False),
    ("-1, 1 - \\sqrt{3}, 1 + \\sqrt{3}", "1\\pm\\sqrt{3}, -1", True),
    ("-1, 1 - \\sqrt{3}, 1 + \\sqrt{3}", "1\\pm\\sqrt{3}", False),
    ("\\frac{1}{2}, -4", "x=-4 \\text{ and } x=\\frac12", True),
    ("\\frac{1}{2}, -4", "x=4 \\text{ and } x=\\frac12", False),
    ("5, 7", "The solutions are 5 and 7.", True),
    ("5, 7", "The solutions are 5 and 8.", False),
    ("\\pm 4", "4, -4", True),
    ("\\pm 4", "-4 or 4", True),
    ("\\pm 4", "4", False),
]

FLOAT_PRECISION = [
    ("\\frac{1}{12}", "0.08333333333333333", True),
    ("\\frac{1}{3}", "0.3333333333333333", True),
    ("\\frac{2}{3}", "0.6666666666666666", True),
    ("\\frac{5}{7}", "0.7142857142857143", True),
    ("\\frac{1}{7}", "0.14285714285714285", True),
    ("\\frac{22}{7}", "3.142857142857143", True),
    ("\\frac{1}{3}", "0.333", False),
    ("\\frac{1}{3}", "0.3333", False),
    ("\\frac{1}{12}", "0.0833", False),
    ("\\frac{2}{3}", "0.667", False),
    ("\\frac{2}{3}", "0.6666666666666667", True),
    ("\\sqrt{2}", "1.4142", False),
    ("\\pi", "3.14159", False),
    ("\\frac{1}{3}", "The tool printed 0.3333333333333333, so the probability is 1/3.", True),
    ("\\frac{1}{12}", "The tool printed 0.08333333333333333", True),
    ("\\frac{1}{12}", "The tool printed 0.0833", False),
]

THOUSANDS = [
    ("1234567", "1,234,567", True),
    ("1234567", "1,234,567 people", True),
    ("1234567", "1{,}234{,}567", True),
    ("1234567", "1\\,234\\,567", True),
    ("1234567", "1,234,568 people", False),
    ("12000", "12,000 m", True),
    ("12000", "12,000 \\text{ meters}", True),
    ("12000", "12 000 meters", True),
    ("12000", "1,200 meters", False),
    ("2500.5", "\\$2,500.50", True),
    ("2500.5", "$2,500.50", True),
    ("2500.5", "\\$2,500.05", False),
    ("45000", "The company earned \\$45,000 in total.", True),
    ("45000", "The company earned \\$4,500 in total.", False),
    ("1000000", "1,000,000 dollars", True),
    ("1000000", "10,000,000 dollars", False),
]

# near misses a loose reader would accept: negations, hedges, partial or extra answers, scale words
ADVERSARIAL = [
    ("42", "The answer is not 42.", False),
    ("42", "It is either 42 or 43.", False),
    ("42", "42 or 43", False),
    ("42", "I am not sure; maybe 41.", False),
    ("42", "x = 42?", False),
    ("42", "approximately 42", False),
    ("42", "Between 40 and 45", False),
    ("42", "42 is wrong; the answer is 24", False),
    ("7", "We need at least 7 more, i.e. 12 in total.", False),
    ("3", "3 cm or 5 cm", False),
    ("10", "10 - 3 = 7", False),
    ("5", "5x", False),
    ("100", "100!", False),
    ("4", "4 i", False),
    ("1", "1 million", False),
    ("1000", "1 thousand", True),
    ("6", "6 squared", False),
    ("2", "2 and 3", False),
    ("3", "x = 3 or x = -3", False),
    ("\\frac{1}{3}", "0.333333333333334", False),
    ("\\frac{1}{3}", "0.333333333333333", True),
    ("12", "12 dozen eggs", False),
    ("0.5", "0.5 million", False),
    ("x \\geq 3", "x \\geq 3 or x \\leq -3", False),
    ("y = 2x + 3", "y = 2x + 3 + z", False),
    ("y = 2x + 3", "y^2 = (2x + 3)^2", False),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\end{pmatrix}", False),
]

# issue 14: several boxes written in a row are one listed answer (order-free against a set)
BOXES_IN_A_ROW = [
    ("(1,2), (2,1)", "Both work, so the pairs are $\\boxed{(1,2)}$, $\\boxed{(2,1)}$.", True),
    ("(2,1), (1,2)", "Both work, so the pairs are $\\boxed{(1,2)}$, $\\boxed{(2,1)}$.", True),
    ("(1,2), (2,1)", "Both work, so the pairs are $\\boxed{(1,2)}$, $\\boxed{(2,2)}$.", False),
    ("(1,2), (2,1)", "Only one works: $\\boxed{(1,2)}$.", False),
    ("k=45, n=2", "Therefore \\boxed{k=45} \\quad\\text{and}\\quad \\boxed{n=2}", True),
    ("k=45, n=2", "Therefore \\boxed{k=45} \\quad\\text{and}\\quad \\boxed{n=3}", False),
    ("3, 5", "The roots are $\\boxed{3}$ and $\\boxed{5}$.", True),
    ("3, 5", "The roots are $\\boxed{5}$ and $\\boxed{3}$.", True),
    ("3, 5", "The roots are $\\boxed{3}$ and $\\boxed{-5}$.", False),
    ("7", "We first guessed \\boxed{5}, then checked: the answer is \\boxed{7}.", True),
    ("7", "It could be \\boxed{7} or \\boxed{8}.", False),
    ("-1, 2, 4", "So $x \\in \\{\\boxed{-1}, \\boxed{2}, \\boxed{4}\\}$ hold.", True),
]

# issue 14: the answer in display math right after a cue, across line breaks
DISPLAY_AFTER_CUE = [
    ("9", "Checking all cases gives the count.\nAnswer \\[ 9 \\]", True),
    ("9", "Checking all cases gives the count.\nAnswer\n$$\n 9 \n$$", True),
    ("9", "Checking all cases gives the count.\nAnswer \\( 9 \\)", True),
    ("9", "Checking all cases gives the count.\nAnswer:\n\\[\n10\n\\]", False),
    ("\\frac{2}{3}", "So the probability follows.\n\nFinal answer:\n$$\n\\frac{2}{3}\n$$", True),
    ("\\frac{2}{3}", "So the probability follows.\n\nFinal answer:\n$$\n\\frac{3}{2}\n$$", False),
    ("x^2 - 1", "Expanding the product.\nThe answer is \\[(x-1)(x+1) = x^2 - 1\\]", True),
    ("x^2 - 1", "Expanding the product.\nThe answer is \\[x^2 + 1\\]", False),
]

# issue 14: Minerva-style endings, chat-template tokens after them, "Final Answer:" with prose
ENDINGS = [
    ("42", "Final Answer: The final answer is $42$. I hope it is correct. <|im_start|>user", True),
    (
        "42",
        "Final Answer: The final answer is $42$. I hope it is correct.<|im_end|>\n<|im_start|>user\nNow solve 2+2.<|im_end|>\n<|im_start|>assistant\nThe answer is 4.",
        True,
    ),
    (
        "4",
        "Final Answer: The final answer is $42$. I hope it is correct.<|im_end|>\n<|im_start|>user\nNow solve 2+2.<|im_end|>\n<|im_start|>assistant\nThe answer is 4.",
        False,
    ),
    ("42", "Final Answer: The final answer is $41$. I hope it is correct. <|im_start|>user", False),
    ("34", "Final Answer: The largest $n$ is 34.", True),
    ("34", "Final Answer: The largest $n$ is 35.", False),
    (
        "\\frac{1}{4}",
        "Final Answer: The final answer is $\\frac{1}{4}$. I hope it is correct.<|endoftext|>",
        True,
    ),
    (
        "12",
        "Final Answer: The smallest possible value of $k$ is $12$.<|eot_id|><|start_header_id|>user",
        True,
    ),
    ("12", "Final Answer: The smallest possible value of $k$ is $21$.<|eot_id|>", False),
]

# issue 14: thousands separators in a box and in prose
THOUSANDS_IN_BOX = [
    ("32349", "\\boxed{32,\\! 349}", True),
    ("32349", "\\boxed{32,\\! 394}", False),
    ("14916", "So she has $\\boxed{14{,}916}$ stamps.", True),
    ("14916", "So she has $\\boxed{14{,}196}$ stamps.", False),
    ("10455", "In total the trucks drove 10,455 miles.", True),
    ("10455", "In total the trucks drove 10,545 miles.", False),
    ("1000000", "The population is \\boxed{1,\\!000,\\!000}.", True),
]

# issue 14: one symbol in two spellings, radicals, reversed assignments, units in \textnormal
SYMBOLS_AND_FORMS = [
    ("e", "\\text{e}", True),
    ("e", "\\mathrm{e}", True),
    ("e^2", "\\mathrm{e}^{2}", True),
    ("e", "\\text{e}^{2}", False),
    ("\\frac{1}{\\sqrt{n}}", "\\sqrt{1/n}", True),
    ("\\frac{1}{\\sqrt{n}}", "\\sqrt{n}", False),
    ("\\frac{\\sqrt{a}}{a}", "\\frac{1}{\\sqrt{a}}", True),
    ("5", "5 = x", True),
    ("5", "6 = x", False),
    ("-3", "-3 = y", True),
    ("10", "10 \\textnormal{ miles}", True),
    ("10", "11 \\textnormal{ miles}", False),
    ("36", "36 \\textnormal{ cm}^2", True),
    ("1 + \\frac{1}{\\mathrm{e}}", "1 + \\frac{1}{e}", True),
    ("1 + \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{e}}", False),
]

# issue 14: text macros that hold mathematics, malformed macros, hedges (a loose grader accepts them)
TEXT_MACROS = [
    ("42", "42\\text{ (or maybe 17)}", False),
    ("42", "42 + \\text{anything}", False),
    ("42", "42\\sqrt(17)", False),
    ("42\\sqrt{17}", "42\\sqrt(17)", True),
    ("42", "42 \\cdot \\text{x}", False),
    ("42", "42 \\operatorname{f}(1)", False),
    ("42", "42\\text{ apples}", True),
    ("42", "42 \\mathrm{apples}", True),
    ("\\sin 1", "\\operatorname{sin} 1", True),
    ("\\sin 1", "\\operatorname{sinc} 1", False),
    ("2", "2 \\frac(1)(2)", False),
    ("17", "\\pm 17", False),
    ("\\sqrt{2}", "\\pm\\sqrt{2}", False),
    ("\\sqrt{2}", "\\sqrt{2}, \\sqrt{3}", False),
    ("3", "3 \\textbf{ maybe}", False),
    ("(3, \\frac{\\pi}{2})", "3, \\frac{\\pi}{2}", True),
    ("(3, \\frac{\\pi}{2})", "3, \\frac{\\pi}{3}", False),
]

CATEGORIES: dict[str, list[tuple[str, str, bool]]] = {
    "sentence": SENTENCE,
    "units": UNITS,
    "relations": RELATIONS,
    "equations": EQUATIONS,
    "matrices": MATRICES,
    "multiple": MULTIPLE,
    "float_precision": FLOAT_PRECISION,
    "thousands_units": THOUSANDS,
    "adversarial": ADVERSARIAL,
    "boxes_in_a_row": BOXES_IN_A_ROW,
    "display_after_cue": DISPLAY_AFTER_CUE,
    "endings": ENDINGS,
    "thousands_in_box": THOUSANDS_IN_BOX,
    "symbols_and_forms": SYMBOLS_AND_FORMS,
    "text_macros": TEXT_MACROS,
}


def is_free_form(prediction: str) -> bool:
    """A sentence or a solution (lenient only), not a bare answer."""
    import re

    bare = re.sub(r"\\[a-zA-Z]+(\{[^{}]*\})?", " ", prediction)
    words = re.findall(r"[A-Za-z]{3,}", bare)
    units = {
        "apples",
        "people",
        "meters",
        "dollars",
        "centimeters",
        "hours",
        "minutes",
        "degrees",
        "percent",
        "mph",
        "and",
        "thousand",
        "million",
        "squared",
        "dozen",
        "eggs",
    }
    return "\n" in prediction or any(w not in units for w in words)
