"""Answer pairs written for rlvr's own tests of the math verifier (not taken from any other project's test files):
(completion, gold, expected Outcome value). Shared by the determinism test and scripts/bench_verifiers.py --per-pair."""

from __future__ import annotations

B = "\\boxed"
C, I, N = "correct", "incorrect", "no_answer"  # noqa: E741 (short names keep the table readable)

# Several boxes that are one answer, in completions (and a box that was hedged)
SEVERAL_BOXES = [
    (f"The roots are {B}{{1}}, {B}{{2}}, {B}{{3}}.", "\\{1, 2, 3\\}", C),
    (f"The roots are {B}{{3}}, {B}{{1}} and {B}{{2}}.", "1, 2, 3", C),
    (f"$x = {B}{{4}}$ or $x = {B}{{-1}}$", "-1, 4", C),
    (f"The pairs are {B}{{(2, 2)}} \\text{{ and }} {B}{{(6, 2)}}.", "(2, 2), (6, 2)", C),
    (f"Factoring gives $x+2=0$, so $x = {B}{{-2}}$. The other factor $x-1=0$ gives $x = {B}{{1}}$.", "1, -2", C),
    (f"{B}{{1}}, {B}{{2}}, {B}{{3}}", "3", I),  # hedging over three answers is not the answer 3
    (f"{B}{{1}}, {B}{{2}}", "1, 2, 3", I),
    (f"First try {B}{{7}}. That was wrong; the answer is {B}{{8}}.", "8", C),
    (f"{B}{{5}}\n\n{B}{{5}}", "5", C),  # the same answer boxed twice
]
# The Minerva format (MATH's few-shot prompt), and a later explicit final-answer line over an earlier box
STATED = [
    ("Final Answer: The final answer is $\\frac{10\\sqrt{10.5}}{27}$. I hope it is correct.",
     "\\frac{10\\sqrt{21}}{27\\sqrt{2}}", C),
    ("Final Answer: The final answer is $\\sqrt{2}+1$. I hope it is correct.", "1+\\sqrt{2}", C),
    ("Final Answer: The final answer is $(3, -1)$. I hope it is correct.", "(3,-1)", C),
    ("Final Answer: The final answer is $12$. I hope it is correct.", "13", I),
    (f"So it is {B}{{5}}.\nWait, I dropped a sign.\nFinal Answer: 6", "6", C),
    (f"So it is {B}{{5}}.\nRechecking the last step, the final answer is $\\frac{{1}}{{3}}$.", "1/3", C),
    (f"Thus {B}{{5}}. This answer is consistent with the check above.", "5", C),
    (f"Thus {B}{{5}}.\nAnswer: let me double check 6", "5", C),  # a plain "Answer:" does not beat a box
    ("The final answer to part (b) is $\\frac{7}{2}$.", "3.5", C),
    ("**Final Answer**: $\\dfrac{3}{4}$", "0.75", C),
    ("Putting it together, the final answer is therefore $\\frac{5}{6}$.", "5/6", C),
    ("So the answer is $-3$ and $5$.", "5, -3", C),
    ("Collecting terms, the answer is:\n\\[\n x = \\frac{1}{4}\n\\]\nThat completes the solution.", "0.25", C),
    ("The answer is 7, not 8.", "8", I),
]
# Thousands in LaTeX and other spellings of one number
NUMBERS = [
    (f"{B}{{11,\\! 111,\\! 111,\\! 100}}", "11111111100", C),
    (f"{B}{{1,\\!000,\\!000}}", "1000000", C),
    (f"{B}{{12{{,}}345}}", "12345", C),
    (f"{B}{{2\\,500}}", "2500", C),
    (f"{B}{{1,2}}", "12", I),
    (f"{B}{{50\\%}}", "50", C),
    (f"{B}{{\\$18.90}}", "18.90", C),
    (f"{B}{{30^\\circ}}", "30", C),
    (f"{B}{{5\\text{{ cm}}}}", "5", C),
    (f"{B}{{0.5}}", "\\frac{1}{2}", C),
    (f"{B}{{1.2e3}}", "1200", C),
    (f"{B}{{-7}}", "7", I),
]
# Answers that need sympy: intervals, ratios, reordered products, sets, equations, roots, trig, matrices
SYMBOLIC = [
    (f"{B}{{[1, 3)}}", "[1,3)", C),
    (f"{B}{{(-\\infty, 3) \\cup (5, \\infty)}}", "(-\\infty,3)\\cup(5,\\infty)", C),
    (f"{B}{{x \\in [-2, 2]}}", "[-2,2]", C),
    (f"{B}{{(0, 1]}}", "[0,1]", I),
    (f"{B}{{2:3}}", "\\frac{2}{3}", C),
    (f"{B}{{3 \\cdot 2 \\cdot x}}", "6x", C),
    (f"{B}{{y x^2}}", "x^2 y", C),
    (f"{B}{{(x-1)(x+1)}}", "x^2-1", C),
    (f"{B}{{(x+1)^2}}", "x^2+2x+1", C),
    (f"{B}{{x^2+2x}}", "x^2+2x+1", I),
    (f"{B}{{\\frac{{\\sqrt{{3}}}}{{2}}}}", "\\frac{\\sqrt3}{2}", C),
    (f"{B}{{\\frac{{1}}{{\\sqrt{{2}}}}}}", "\\frac{\\sqrt{2}}{2}", C),
    (f"{B}{{2\\sqrt{{2}}}}", "\\sqrt{8}", C),
    (f"{B}{{\\sin^2 x + \\cos^2 x}}", "1", C),
    (f"{B}{{\\frac{{\\pi}}{{4}}}}", "45^\\circ", I),  # math_verify does not equate radians and degrees either
    (f"{B}{{\\{{3, 1, 2\\}}}}", "\\{1,2,3\\}", C),
    (f"{B}{{x = 5}}", "5", C),
    (f"{B}{{y = 2x + 3}}", "2x+3", C),
    (f"{B}{{\\log_2 8}}", "3", C),
    (f"{B}{{e^{{i\\pi}}}}", "-1", I),  # nor evaluate e^{i pi}
    (f"{B}{{3+4i}}", "4i+3", C),
    (f"{B}{{\\begin{{pmatrix}} 1 \\\\ 2 \\end{{pmatrix}}}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", C),
    (f"{B}{{\\binom{{6}}{{3}}}}", "20", C),
    (f"{B}{{2^{{10}}}}", "1024", C),
    (f"{B}{{\\frac{{100!}}{{98!}}}}", "9900", C),
    (f"{B}{{x \\geq 3}}", "[3, \\infty)", I),  # nor read an inequality as an interval
    (f"{B}{{\\frac{{x^{{6}}-1}}{{x-1}}}}", "x^5+x^4+x^3+x^2+x+1", C),
    (f"{B}{{10-9+8-7+6-5+4-3+2-1+10-9+8-7+6-5+4-3+2-1}}", "10", C),
]
# Text answers and markers
OTHER = [
    (f"{B}{{\\text{{Monday}}}}", "Monday", C),
    (f"{B}{{\\text{{(C)}}}}", "(C)", C),
    ("The answer is: 14", "14", C),
    ("Some work.\n#### 72", "72", C),
    ("so 5 + 9 = 14", "14", N),  # no marker: refused by design
    ("<answer>14</answer>", "14", N),
]
# Answers stated in prose after a marker: a number or math after a few words, math then words, units, headings
PROSE = [
    ("Counting the factors one by one.\nAnswer: There are 12 positive divisors.", "12", C),
    ("Answer: There are 12 positive divisors.", "10", I),
    ("Rounding at the end, the final answer is approximately 2.72.", "2.72", C),
    ("So the answer is 340 dollars, earned over the five weeks.", "340", C),
    ("The final answer is 21, since 3 \\cdot 7 = 21.", "21", C),
    ("**Answer:** $\\frac{3}{8}$ of the pizza", "\\frac38", C),
    ("The final answer is $6$ chairs, because $30 - 24 = 6$.", "6", C),
    (f"{B}{{18\\text{{ cm}}^2}}", "18", C),
    ("**Answer: 45 km/h**", "45", C),
    ("The answer is 3,500 tickets.", "3500", C),
    ("Working through the cases gives the result.\n\n### Final Answer\nThe garden needs 14 plants.", "14", C),
    ("**Answer.** $\\frac{9}{4}$", "2.25", C),
    ("The final answer to $g(2)$ is $11$.", "11", C),
    (f"So the total is ${B}{{40}}$. To double-check, the final answer is consistent: $8 \\cdot 5 = 40$.", "40", C),
    (f"The answer is ${B}{{7}}$. Let me verify: the answer is correct since $7 + 3 = 10$.", "7", C),
    # a unit or a remark in parentheses after the math (found by make mutation's _tidy survivor, 2026-12-05)
    ("The answer is $12$ (cm).", "12", C),
    ("Final Answer: **$12$** (in cm)", "12", C),
    ("The answer is $\\frac{3}{2}$ (square units).", "1.5", C),
    ("The answer is $12$ (cm).", "13", I),
    ("Final Answer: $x$ (x + 1)", "1", I),  # math in the parentheses: not a remark, nothing credited
]
# A final-answer sentence whose subject "is" the value: the Minerva line with a noun phrase before "is", and the
# Qwen-Math "Final Answer" heading with \\( \\) math; a hedge, a supposition or a take-back is not credited
SENTENCES = [
    ("Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "120", C),
    ("Final Answer: The volume of the box is $120$ cubic inches. I hope it is correct.", "120", C),
    ("Final Answer: The largest possible value of $k$ is $\\frac{7}{3}$. I hope it is correct.", "\\frac73", C),
    ("Final Answer: The number of ordered pairs $(a, b)$ is 6. I hope it is correct.", "6", C),
    ("Final Answer: The sum of the roots of $x^2-5x+6=0$ is $5$. I hope it is correct.", "5", C),
    ("Final Answer: The distance from $P$ to the line, in units, is $\\sqrt{13}$. I hope it is correct.", "\\sqrt{13}", C),
    ("Final Answer: The remainder when $2^{100}$ is divided by 7 is 2. I hope it is correct.", "2", C),
    ("Final Answer: The sum of the roots of $x^2-5x+6=0$ is $5$. I hope it is correct.", "6", I),
    ("**Final Answer**\n\nThe smallest positive integer $n$ is \\(12\\).", "12", C),
    ("### Final Answer\nThe probability that both draws are red is \\(\\frac{3}{10}\\).", "0.3", C),
    ("**Final Answer:** The value of $a+b$ is \\(-4\\).", "-4", C),
    ("Final Answer: The largest $n$ is probably $34$. I hope it is correct.", "34", I),
    ("Final Answer: If $n$ is 34, the sum is 595.", "34", I),
    ("Final Answer: The largest $n$ is 34, not 35.", "35", I),
    ("Final Answer: $n = 6$, so the sum is 21.", "21", I),
    (f"So $n = {B}{{34}}$.\n\nFinal Answer: see above", "34", C),
]
# Correct answers whose symbolic check is heavier (they needed 0.1-0.6 s against the old wall-clock deadline)
HEAVY = [
    (f"{B}{{\\left(-\\infty, -\\frac{{1}}{{2}}\\right) \\cup \\left(\\frac{{1}}{{3}}, \\infty\\right)}}",
     "(-\\infty,-\\frac12)\\cup(\\frac13,\\infty)", C),
    (f"{B}{{\\frac{{2\\sqrt{{6}}}}{{3}}: 1}}", "\\frac{2\\sqrt6}{3}", C),
    (f"{B}{{(2x+3)(x-4)(x+1)}}", "(x+1)(2x+3)(x-4)", C),
    (f"{B}{{\\frac{{x+1}}{{x^2-1}}}}", "\\frac{1}{x-1}", C),
    (f"{B}{{\\tan\\frac{{\\pi}}{{8}}}}", "\\sqrt{2}-1", C),
    (f"{B}{{\\frac{{3\\sqrt{{5}}+\\sqrt{{45}}}}{{2}}}}", "3\\sqrt{5}", C),
]
PAIRS = SEVERAL_BOXES + STATED + NUMBERS + SYMBOLIC + OTHER + PROSE + SENTENCES + HEAVY
