package peers

import "time"

// keyedBuckets are token buckets by key (a source address, a peer's
// name): each refills rate tokens a second up to burst. At most max keys
// are remembered: past it the buckets that are full again (idle keys) are
// forgotten first, then all of them (every key starts with a full
// burst). Not safe for concurrent use: its owner's lock guards it.
type keyedBuckets struct {
	rate, burst float64
	max         int
	m           map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	at     time.Time
}

// take takes a token from key's bucket at now and reports whether there
// was one.
func (kb *keyedBuckets) take(key string, now time.Time) bool {
	if kb.m == nil {
		kb.m = map[string]*tokenBucket{}
	}
	b, ok := kb.m[key]
	if !ok {
		if len(kb.m) >= kb.max {
			for k, o := range kb.m {
				if o.tokens+now.Sub(o.at).Seconds()*kb.rate >= kb.burst {
					delete(kb.m, k)
				}
			}
			if len(kb.m) >= kb.max {
				clear(kb.m)
			}
		}
		b = &tokenBucket{tokens: kb.burst, at: now}
		kb.m[key] = b
	}
	b.tokens = min(kb.burst, b.tokens+now.Sub(b.at).Seconds()*kb.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
