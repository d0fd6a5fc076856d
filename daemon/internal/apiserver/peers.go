package apiserver

import (
	"net/http"

	"github.com/fusiond/fusiond/daemon/api"
)

// PeerBackend is the daemon's membership among its peers
// (daemon/internal/peers.Node).
type PeerBackend interface {
	Peers() api.PeerList
	Keyring(req api.KeyringRequest) (api.PeerList, error)
}

// peerHandlers serve the peer routes (listed in Routes).
func (s *Server) peerHandlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET /v1/peers":          s.peers,
		"POST /v1/peers/keyring": s.admin(s.keyring),
	}
}

func (s *Server) peers(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r); err != nil {
		writeError(w, err)
		return
	}
	if s.cfg.Peers == nil {
		writeJSON(w, http.StatusOK, api.PeerList{Peers: []api.Peer{}})
		return
	}
	writeJSON(w, http.StatusOK, s.cfg.Peers.Peers())
}

func (s *Server) keyring(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Peers == nil {
		writeError(w, api.Errorf(api.CodeConflict, "this daemon runs without peers (peers.enabled is false)"))
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req api.KeyringRequest
	if err := api.DecodeStrict(body, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := req.Validate(); err != nil {
		writeError(w, err)
		return
	}
	out, err := s.cfg.Peers.Keyring(req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
