package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/fusiond/fusiond/devices/fpga/bitstream"
	"github.com/fusiond/fusiond/topology"
)

// Topology returns the host model.
func (c *Client) Topology(ctx context.Context) (*topology.Host, error) {
	var h topology.Host
	if err := c.do(ctx, http.MethodGet, "/v1/topology", nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// TopologyMatrix returns the device distance matrix.
func (c *Client) TopologyMatrix(ctx context.Context) (TopologyMatrix, error) {
	var m TopologyMatrix
	err := c.do(ctx, http.MethodGet, "/v1/topology/matrix", nil, &m)
	return m, err
}

// GPUs returns the GPU inventory with health, MIG state and telemetry.
func (c *Client) GPUs(ctx context.Context) (GPUList, error) {
	var l GPUList
	err := c.do(ctx, http.MethodGet, "/v1/gpus", nil, &l)
	return l, err
}

// PlanMIG plans a mig-parted layout config without applying it.
func (c *Client) PlanMIG(ctx context.Context, req MIGRequest) (MIGPlan, error) {
	return c.mig(ctx, "/v1/mig/plan", req)
}

// ApplyMIG applies a mig-parted layout config (admin).
func (c *Client) ApplyMIG(ctx context.Context, req MIGRequest) (MIGPlan, error) {
	return c.mig(ctx, "/v1/mig/apply", req)
}

func (c *Client) mig(ctx context.Context, path string, req MIGRequest) (MIGPlan, error) {
	var p MIGPlan
	body, err := json.Marshal(req)
	if err != nil {
		return p, err
	}
	err = c.do(ctx, http.MethodPost, path, body, &p)
	return p, err
}

// InjectGPUFault injects an Xid into, or resets, a simulated GPU (admin).
func (c *Client) InjectGPUFault(ctx context.Context, index int, req GPUFaultRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, fmt.Sprintf("/v1/gpus/%d/fault", index), body, nil)
}

// SetGPUProcesses sets the compute processes a simulated GPU reports
// (admin).
func (c *Client) SetGPUProcesses(ctx context.Context, index int, req GPUProcessesRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, fmt.Sprintf("/v1/gpus/%d/processes", index), body, nil)
}

// FPGARegions lists the FPGA regions.
func (c *Client) FPGARegions(ctx context.Context) ([]FPGARegion, error) {
	var rs []FPGARegion
	err := c.do(ctx, http.MethodGet, "/v1/fpga/regions", nil, &rs)
	return rs, err
}

// ProgramFPGA programs a region with a library bitstream (admin).
func (c *Client) ProgramFPGA(ctx context.Context, region string, req FPGAProgramRequest) (FPGAProgramResult, error) {
	var res FPGAProgramResult
	body, err := json.Marshal(req)
	if err != nil {
		return res, err
	}
	err = c.do(ctx, http.MethodPost, "/v1/fpga/regions/"+url.PathEscape(region)+"/program", body, &res)
	return res, err
}

// Bitstreams lists the bitstream library.
func (c *Client) Bitstreams(ctx context.Context) ([]bitstream.Bitstream, error) {
	var l []bitstream.Bitstream
	err := c.do(ctx, http.MethodGet, "/v1/fpga/bitstreams", nil, &l)
	return l, err
}

// AddBitstream uploads size bytes from r as a bitstream (admin). fileName
// is the original file name (it identifies raw .bin/.rbf images); name is
// the library name ("" for none). The body is streamed, not buffered.
func (c *Client) AddBitstream(ctx context.Context, r io.Reader, size int64, name, fileName string) (bitstream.Bitstream, error) {
	var b bitstream.Bitstream
	q := url.Values{}
	if name != "" {
		q.Set("name", name)
	}
	if fileName != "" {
		q.Set("file", fileName)
	}
	path := "/v1/fpga/bitstreams"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://fusiond"+path, r)
	if err != nil {
		return b, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.roundTrip(ctx, req)
	if err != nil {
		return b, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		return b, fmt.Errorf("decoding bitstream upload response: %w", err)
	}
	return b, nil
}

// RemoveBitstream removes a bitstream from the library (admin).
func (c *Client) RemoveBitstream(ctx context.Context, ref string) (bitstream.Bitstream, error) {
	var b bitstream.Bitstream
	err := c.do(ctx, http.MethodDelete, "/v1/fpga/bitstreams/"+url.PathEscape(ref), nil, &b)
	return b, err
}
