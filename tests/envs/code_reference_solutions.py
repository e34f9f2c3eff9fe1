"""Reference solutions for the bundled code tasks, keyed by task id; each must pass all its tests."""

SOLUTIONS: dict[str, str] = {
    "add": """\
def add(a, b):
    return a + b
""",
    "is_even": """\
def is_even(n):
    return n % 2 == 0
""",
    "reverse_string": """\
def reverse_string(s):
    return s[::-1]
""",
    "factorial": """\
def factorial(n):
    result = 1
    for i in range(2, n + 1):
        result *= i
    return result
""",
    "fibonacci": """\
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
""",
    "is_palindrome": """\
def is_palindrome(s):
    chars = [c.lower() for c in s if c.isalnum()]
    return chars == chars[::-1]
""",
    "count_vowels": """\
def count_vowels(s):
    return sum(1 for c in s.lower() if c in 'aeiou')
""",
    "largest": """\
def largest(xs):
    best = xs[0]
    for x in xs[1:]:
        if x > best:
            best = x
    return best
""",
    "sum_digits": """\
def sum_digits(n):
    return sum(int(d) for d in str(n))
""",
    "is_prime": """\
def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True
""",
    "gcd": """\
def gcd(a, b):
    while b:
        a, b = b, a % b
    return a
""",
    "flatten": """\
def flatten(items):
    out = []
    for item in items:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
""",
    "word_frequencies": """\
def word_frequencies(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
""",
    "fizzbuzz": """\
def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        s = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')
        out.append(s or str(i))
    return out
""",
    "celsius_to_fahrenheit": """\
def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 32
""",
    "second_largest": """\
def second_largest(xs):
    values = sorted(set(xs))
    return values[-2] if len(values) >= 2 else None
""",
    "remove_duplicates": """\
def remove_duplicates(xs):
    seen = set()
    out = []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
""",
    "capitalize_words": """\
def capitalize_words(s):
    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))
""",
    "binary_search": """\
def binary_search(xs, target):
    lo, hi = 0, len(xs) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if xs[mid] == target:
            return mid
        if xs[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
""",
    "merge_sorted": """\
def merge_sorted(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]
""",
    "are_anagrams": """\
def are_anagrams(a, b):
    norm = lambda s: sorted(s.replace(' ', '').lower())
    return norm(a) == norm(b)
""",
    "run_length_encode": """\
def run_length_encode(s):
    out = []
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f'{s[i]}{j - i}')
        i = j
    return ''.join(out)
""",
    "chunk": """\
def chunk(xs, size):
    return [xs[i:i + size] for i in range(0, len(xs), size)]
""",
    "roman_to_int": """\
def roman_to_int(s):
    values = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}
    total = 0
    for i, c in enumerate(s):
        v = values[c]
        if i + 1 < len(s) and values[s[i + 1]] > v:
            total -= v
        else:
            total += v
    return total
""",
    "multiply": """\
def multiply(a, b):
    return a * b
""",
    "is_leap_year": """\
def is_leap_year(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
""",
    "count_words": """\
def count_words(s):
    return len(s.split())
""",
    "square_all": """\
def square_all(xs):
    return [x * x for x in xs]
""",
    "min_max": """\
def min_max(xs):
    return (min(xs), max(xs))
""",
    "caesar_shift": """\
def caesar_shift(s, k):
    return ''.join(chr((ord(c) - 97 + k) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)
""",
    "binary_to_int": """\
def binary_to_int(bits):
    value = 0
    for b in bits:
        value = value * 2 + (b == '1')
    return value
""",
    "transpose": """\
def transpose(matrix):
    return [list(col) for col in zip(*matrix)]
""",
    "most_common_char": """\
def most_common_char(s):
    return max(s, key=lambda c: (s.count(c), -s.index(c)))
""",
    "int_to_roman": """\
def int_to_roman(n):
    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),
             (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]
    out = []
    for value, symbol in table:
        while n >= value:
            out.append(symbol)
            n -= value
    return ''.join(out)
""",
    "balanced_brackets": """\
def balanced_brackets(s):
    pairs = {')': '(', ']': '[', '}': '{'}
    stack = []
    for c in s:
        if c in '([{':
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
""",
    "pascal_row": """\
def pascal_row(n):
    row = [1]
    for _ in range(n):
        row = [1] + [a + b for a, b in zip(row, row[1:])] + [1]
    return row
""",
}
