package tokenizer

// byteLevelAlphabet returns the GPT-2 byte-to-rune table: printable bytes
// map to themselves, the rest to runes from U+0100 up, so that every byte
// has a visible, non-whitespace stand-in.
func byteLevelAlphabet() [256]rune {
	var table [256]rune
	var used [256]bool
	for b := '!'; b <= '~'; b++ {
		table[b], used[b] = b, true
	}
	for b := '¡'; b <= '¬'; b++ {
		table[b], used[b] = b, true
	}
	for b := '®'; b <= 'ÿ'; b++ {
		table[b], used[b] = b, true
	}
	n := rune(0)
	for b := range 256 {
		if !used[b] {
			table[b] = 256 + n
			n++
		}
	}
	return table
}

// tokenBytes turns a vocabulary string in the byte-level alphabet back into
// raw bytes. A string with a rune outside the alphabet (an added token
// stored verbatim) is returned as its own UTF-8 bytes, as Hugging Face does.
func tokenBytes(tok string, inverse map[rune]byte) []byte {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := inverse[r]
		if !ok {
			return []byte(tok)
		}
		out = append(out, b)
	}
	return out
}
