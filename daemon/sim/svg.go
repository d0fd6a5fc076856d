package sim

import "io"

// WriteSVG draws allocation vs arrived request per policy.
func WriteSVG(w io.Writer, rep *Report) error { return nil }
