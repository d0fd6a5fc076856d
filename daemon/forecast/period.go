package forecast

import (
	"math"
	"math/cmplx"
)

// DetectPeriod finds the season of y: the lag in [minP, maxP] where y's
// autocorrelation has its highest local peak, the autocorrelation
// computed by FFT (Wiener–Khinchin: the inverse transform of the
// zero-padded series' power spectrum). strength is the autocorrelation
// there (−1..1); a period is reported only when it is at least 0.3,
// otherwise 0.
func DetectPeriod(y []float64, minP, maxP int) (period int, strength float64) {
	acf := autocorrelation(y)
	if acf == nil || minP < 2 {
		return 0, 0
	}
	maxP = min(maxP, len(y)-2)
	for lag := max(minP, 1); lag <= maxP; lag++ {
		if acf[lag] > acf[lag-1] && acf[lag] >= acf[lag+1] && acf[lag] > strength {
			period, strength = lag, acf[lag]
		}
	}
	if strength < 0.3 {
		return 0, strength
	}
	return period, strength
}

// autocorrelation of y at every lag (acf[0] = 1; unbiased), nil for a constant or
// too short series.
func autocorrelation(y []float64) []float64 {
	n := len(y)
	if n < 8 {
		return nil
	}
	var mean float64
	for _, v := range y {
		mean += v
	}
	mean /= float64(n)
	size := 1
	for size < 2*n {
		size <<= 1
	}
	x := make([]complex128, size)
	for i, v := range y {
		x[i] = complex(v-mean, 0)
	}
	fft(x)
	for i, c := range x {
		x[i] = complex(sqAbs(c), 0) // conj of a real value: itself
	}
	fft(x) // the power spectrum is real and even: its forward transform is the inverse's size times
	if real(x[0]) <= 1e-12 {
		return nil
	}
	acf := make([]float64, n)
	for i := range acf {
		// Unbiased: each lag's sum over its n−i pairs, so a season's
		// peak is not pulled to a shorter lag.
		acf[i] = real(x[i]) / float64(n-i) / (real(x[0]) / float64(n))
	}
	return acf
}

func sqAbs(c complex128) float64 { return real(c)*real(c) + imag(c)*imag(c) }

// fft is an in-place iterative radix-2 FFT; len(x) is a power of two.
func fft(x []complex128) {
	n := len(x)
	for i, j := 1, 0; i < n; i++ {
		bit := n >> 1
		for ; j&bit != 0; bit >>= 1 {
			j ^= bit
		}
		j ^= bit
		if i < j {
			x[i], x[j] = x[j], x[i]
		}
	}
	for size := 2; size <= n; size <<= 1 {
		w := cmplx.Exp(complex(0, -2*math.Pi/float64(size)))
		for start := 0; start < n; start += size {
			wk := complex(1, 0)
			for k := range size / 2 {
				a, b := x[start+k], x[start+k+size/2]*wk
				x[start+k], x[start+k+size/2] = a+b, a-b
				wk *= w
			}
		}
	}
}
