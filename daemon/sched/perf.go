package sched

import "strings"

// GPUSpec is one GPU model's published figures: dense (no sparsity) tensor
// throughput per precision, the board power limit (TDP) and a typical idle
// draw. Sources are cited per model in the table below and in
// docs/scheduling.md ("GPU model table"); a zero throughput means the
// datasheet lists none for that precision.
type GPUSpec struct {
	// Name is the table's name of the model, e.g. "H100 SXM".
	Name string
	// CUDA is the CUDA compute capability, e.g. "9.0".
	CUDA string
	// FP16 (FP16/BF16 tensor), FP8 and INT8 are dense TFLOPS (TOPS).
	FP16, FP8, INT8 float64
	// TDPW is the maximum board power, IdleW a typical idle draw (an
	// estimate, not a datasheet figure: measured power takes precedence).
	TDPW, IdleW float64
	// base is the model's name token ("H100"); variant a further token
	// that must appear ("PCIE", "NVL"), "" for the default form.
	base, variant string
}

// gpuSpecs is the model table, the default form of each base model last
// among its variants. It is a function so the table is never shared
// mutable state.
func gpuSpecs() []GPUSpec {
	return []GPUSpec{
		// NVIDIA HGX B200 / DGX B200 datasheet (9 PFLOPS FP8 sparse per GPU).
		{Name: "B200", CUDA: "10.0", FP16: 2250, FP8: 4500, INT8: 4500, TDPW: 1000, IdleW: 140, base: "B200"},
		// NVIDIA H200 Tensor Core GPU datasheet (NVL column).
		{Name: "H200 NVL", CUDA: "9.0", FP16: 835.5, FP8: 1670.5, INT8: 1670.5, TDPW: 600, IdleW: 60, base: "H200", variant: "NVL"},
		// NVIDIA H200 Tensor Core GPU datasheet (SXM column: 1,979 TFLOPS FP16 sparse).
		{Name: "H200 SXM", CUDA: "9.0", FP16: 989.5, FP8: 1979, INT8: 1979, TDPW: 700, IdleW: 75, base: "H200"},
		// NVIDIA H100 Tensor Core GPU datasheet (PCIe column).
		{Name: "H100 PCIe", CUDA: "9.0", FP16: 756.5, FP8: 1513, INT8: 1513, TDPW: 350, IdleW: 45, base: "H100", variant: "PCIE"},
		// NVIDIA H100 Tensor Core GPU datasheet (NVL column).
		{Name: "H100 NVL", CUDA: "9.0", FP16: 835.5, FP8: 1670.5, INT8: 1670.5, TDPW: 400, IdleW: 50, base: "H100", variant: "NVL"},
		// NVIDIA H100 Tensor Core GPU datasheet (SXM column: 1,979 TFLOPS FP16 sparse).
		{Name: "H100 SXM", CUDA: "9.0", FP16: 989.5, FP8: 1979, INT8: 1979, TDPW: 700, IdleW: 70, base: "H100"},
		// NVIDIA A100 Tensor Core GPU datasheet (312 TFLOPS FP16 dense; 80 GB PCIe 300 W).
		{Name: "A100 PCIe", CUDA: "8.0", FP16: 312, INT8: 624, TDPW: 300, IdleW: 35, base: "A100", variant: "PCIE"},
		// NVIDIA A100 Tensor Core GPU datasheet (312 TFLOPS FP16 dense, SXM 400 W).
		{Name: "A100 SXM", CUDA: "8.0", FP16: 312, INT8: 624, TDPW: 400, IdleW: 50, base: "A100"},
		// NVIDIA L40S datasheet (733 TFLOPS FP16 sparse).
		{Name: "L40S", CUDA: "8.9", FP16: 362.05, FP8: 733, INT8: 733, TDPW: 350, IdleW: 35, base: "L40S"},
		// NVIDIA L40 datasheet (362.1 TFLOPS FP16 sparse).
		{Name: "L40", CUDA: "8.9", FP16: 181.05, FP8: 362, INT8: 362, TDPW: 300, IdleW: 30, base: "L40"},
		// NVIDIA L4 Tensor Core GPU datasheet (242 TFLOPS FP16 sparse).
		{Name: "L4", CUDA: "8.9", FP16: 121, FP8: 242.5, INT8: 242.5, TDPW: 72, IdleW: 16, base: "L4"},
		// NVIDIA A30 datasheet (165 TFLOPS FP16 dense).
		{Name: "A30", CUDA: "8.0", FP16: 165, INT8: 330, TDPW: 165, IdleW: 25, base: "A30"},
		// NVIDIA A10 datasheet (125 TFLOPS FP16 dense).
		{Name: "A10", CUDA: "8.6", FP16: 125, INT8: 250, TDPW: 150, IdleW: 20, base: "A10"},
		// NVIDIA T4 datasheet (65 TFLOPS FP16 mixed precision).
		{Name: "T4", CUDA: "7.5", FP16: 65, INT8: 130, TDPW: 70, IdleW: 10, base: "T4"},
		// NVIDIA V100 datasheet (PCIe: 112 TFLOPS tensor).
		{Name: "V100 PCIe", CUDA: "7.0", FP16: 112, TDPW: 250, IdleW: 30, base: "V100", variant: "PCIE"},
		// NVIDIA V100 datasheet (SXM2: 125 TFLOPS tensor).
		{Name: "V100 SXM2", CUDA: "7.0", FP16: 125, TDPW: 300, IdleW: 40, base: "V100"},
		// NVIDIA Tesla P100 datasheet (PCIe: 18.7 TFLOPS FP16, no tensor cores).
		{Name: "P100 PCIe", CUDA: "6.0", FP16: 18.7, TDPW: 250, IdleW: 30, base: "P100", variant: "PCIE"},
		// NVIDIA Tesla P100 datasheet (SXM2: 21.2 TFLOPS FP16, no tensor cores).
		{Name: "P100 SXM2", CUDA: "6.0", FP16: 21.2, TDPW: 300, IdleW: 30, base: "P100"},
	}
}

// ReferenceModel is the model delivered compute is counted in: an
// A100-equivalent GPU-hour is an hour of its dense FP16 tensor throughput
// (ReferenceFP16, 312 TFLOPS).
const ReferenceModel = "A100 SXM"

// ReferenceFP16 is ReferenceModel's dense FP16 TFLOPS, read from the table.
func ReferenceFP16() float64 {
	s, _ := LookupGPU(ReferenceModel)
	return s.FP16
}

// neutralPerf is what an unknown GPU model counts as, for both its
// relative compute and its relative performance per watt.
const neutralPerf = 0.5

// LookupGPU finds a GPU model in the table by the name a driver reports
// ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4"): the
// model's name must be one of the name's words, and a variant's word
// (PCIe, NVL) must be there too.
func LookupGPU(model string) (GPUSpec, bool) {
	words := ModelWords(model)
	has := func(w string) bool {
		for _, x := range words {
			if x == w {
				return true
			}
		}
		return false
	}
	for _, s := range gpuSpecs() {
		if has(s.base) && (s.variant == "" || has(s.variant)) {
			return s, true
		}
	}
	return GPUSpec{}, false
}

// ModelWords splits a GPU model name into its words, letters and digits,
// upper case ("NVIDIA A100-SXM4-80GB": NVIDIA, A100, SXM4, 80GB): how
// model names are compared, in the table and against a job's spec.
func ModelWords(model string) []string {
	return strings.FieldsFunc(strings.ToUpper(model), func(r rune) bool {
		return (r < 'A' || r > 'Z') && (r < '0' || r > '9')
	})
}

// Throughput is the dense TFLOPS the model offers a class: training at
// FP16/BF16, inference at FP8 (INT8 where there is no FP8, FP16 where
// neither is listed), batch and service work at FP16/BF16.
func (s GPUSpec) Throughput(c Class) float64 {
	if c == ClassInference {
		switch {
		case s.FP8 > 0:
			return s.FP8
		case s.INT8 > 0:
			return s.INT8
		}
	}
	return s.FP16
}

// PerfPerWatt is the class's throughput per board watt.
func (s GPUSpec) PerfPerWatt(c Class) float64 {
	if s.TDPW <= 0 {
		return 0
	}
	return s.Throughput(c) / s.TDPW
}

// best is the table's highest value of f.
func best(f func(GPUSpec) float64) float64 {
	m := 0.0
	for _, s := range gpuSpecs() {
		m = max(m, f(s))
	}
	return m
}

// ModelCapability is a GPU model's compute for a class relative to the
// table's best model for that class (0..1]; neutralPerf for a model the
// table does not know.
func ModelCapability(model string, c Class) float64 {
	s, ok := LookupGPU(model)
	if !ok {
		return neutralPerf
	}
	return s.Throughput(c) / best(func(x GPUSpec) float64 { return x.Throughput(c) })
}

// ModelPerfPerWatt is a GPU model's performance per watt for a class
// relative to the table's most efficient model for it (0..1]; neutralPerf
// for a model the table does not know.
func ModelPerfPerWatt(model string, c Class) float64 {
	s, ok := LookupGPU(model)
	if !ok {
		return neutralPerf
	}
	return s.PerfPerWatt(c) / best(func(x GPUSpec) float64 { return x.PerfPerWatt(c) })
}
