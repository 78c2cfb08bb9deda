"""wordfreq.py FILE N: the N most frequent words of FILE, as "word count", most frequent first (ties: a-z)."""
import sys


def top_words(text, n):
    counts = {}
    for line in text.split("\n"):
        words = line.lower().split(" ")
        first = words[0]
        counts[first] = counts.get(first, 0) + 1
        for w in words[1:]:
            counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
    return [ranked[i] for i in range(n)]


if __name__ == "__main__":
    text = open(sys.argv[1]).read()
    for word, count in top_words(text, int(sys.argv[2])):
        print(word, count)
