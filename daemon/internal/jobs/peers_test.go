package jobs_test

import (
	"context"
	"errors"
	"log/slog"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// noPeers is an Overflow whose peers take nothing: the manager accepts
// peers' jobs and offers none successfully.
type noPeers struct{}

func (noPeers) Offer(context.Context, string, api.Job) (api.Handover, error) {
	return api.Handover{}, errors.New("no peer has room")
}

func (noPeers) Poll(context.Context, api.Handover, int64) (handover.RemoteStatus, error) {
	return handover.RemoteStatus{}, handover.ErrRemoteGone
}

func (noPeers) Cancel(context.Context, api.Handover) error { return nil }

// withPeers turns peers on for m (before Recover), wired as the daemon
// wires them (daemon/peersconfig.go).
func withPeers(m *jobs.Manager, cfg handover.Config, p jobs.PeerPolicy) *handover.Agent {
	a := handover.New(m.Records(), cfg, slog.New(slog.DiscardHandler))
	a.Connect(noPeers{})
	m.SetHandover(a, p)
	return a
}
