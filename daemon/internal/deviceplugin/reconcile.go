package deviceplugin

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/fusiond/fusiond/daemon/api"
)

// whyGone is the reason given for a hold released by the reconcile loop.
const whyGone = "kubelet no longer has the pod"

// maxPodResourcesMsg bounds kubelet's List answer (a node with many pods).
const maxPodResourcesMsg = 16 << 20

// reconciler is the reconcile loop's own state.
type reconciler struct {
	// lastSeen is when each hold was last found in kubelet's pod
	// resources.
	lastSeen map[string]time.Time
	// down says the current pod-resources outage was logged;
	// badCheckpoint that kubelet's checkpoint could not be read.
	down, badCheckpoint bool
}

func (p *Plugin) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.Reconcile)
	defer t.Stop()
	r := &reconciler{lastSeen: map[string]time.Time{}}
	for {
		p.reconcile(ctx, r)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.reconcileNow:
		}
	}
}

// devKey is one device of one resource.
type devKey struct{ resource, id string }

// reconcile compares the daemon's holds with kubelet's pod resources once:
// a hold whose devices a pod container has is bound to it (again, when it
// was bound to another); a hold none of whose devices any container has is
// released once it has been missing for Grace. While the pod-resources
// API fails nothing is released.
func (p *Plugin) reconcile(ctx context.Context, r *reconciler) {
	resp, err := p.listPods(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		p.upSince, p.podResourcesUp = time.Time{}, false
		p.mu.Unlock()
		if !r.down {
			p.log.Warn("kubelet's pod-resources API does not answer: no hold is released until it does", "socket", p.cfg.PodResources, "err", err)
			r.down = true
		}
		return
	}
	if r.down {
		p.log.Info("kubelet's pod-resources API answers again")
		r.down = false
	}
	now := p.t.now()
	p.mu.Lock()
	if p.upSince.IsZero() {
		p.upSince = now
	}
	upSince := p.upSince
	p.podResourcesUp = true
	p.mu.Unlock()

	index := map[devKey][]api.PodRef{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			ref := api.PodRef{Namespace: pod.GetNamespace(), Name: pod.GetName(), Container: c.GetName()}
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					k := devKey{d.GetResourceName(), id}
					index[k] = append(index[k], ref)
				}
			}
		}
	}

	// The pods' UIDs come from kubelet's checkpoint, read after the
	// list so that it covers every pod the list named.
	uids, err := readPodUIDs(p.cfg.Dir)
	if err != nil && !r.badCheckpoint {
		p.log.Warn("kubelet's device checkpoint unreadable: pods' UIDs unknown", "err", err)
	}
	r.badCheckpoint = err != nil

	holds := p.pool.Holds()
	current := make(map[string]bool, len(holds))
	for _, h := range holds {
		current[h.ID] = true
		if ref, ok := match(h, index); ok {
			r.lastSeen[h.ID] = now
			for _, id := range h.Devices {
				if u, ok := uids[devKey{h.Resource, id}]; ok && u.container == ref.Container {
					ref.UID = u.uid
					break
				}
			}
			if h.Pod != nil && samePod(*h.Pod, ref) && (ref.UID == "" || h.Pod.UID == ref.UID) {
				continue
			}
			if err := p.pool.Bind(h.ID, ref); err != nil {
				p.log.Warn("cannot bind a hold to its pod", "hold", h.ID, "pod", podName(ref), "err", err)
				continue
			}
			p.mu.Lock()
			p.binds++
			p.mu.Unlock()
			if h.Pod == nil {
				p.log.Info("hold bound to its pod", "hold", h.ID, "resource", h.Resource, "pod", podName(ref))
			} else {
				p.log.Info("hold bound to another pod: kubelet gave its devices to it", "hold", h.ID, "resource", h.Resource, "from", podName(*h.Pod), "pod", podName(ref))
			}
			continue
		}
		since := h.Created
		if t := r.lastSeen[h.ID]; t.After(since) {
			since = t
		}
		if upSince.After(since) {
			since = upSince
		}
		if now.Sub(since) < p.cfg.Grace {
			continue
		}
		if err := p.pool.Release(h.ID, whyGone); err != nil {
			p.log.Warn("cannot release a hold", "hold", h.ID, "err", err)
			continue
		}
		delete(r.lastSeen, h.ID)
		p.mu.Lock()
		p.releases++
		p.mu.Unlock()
		attrs := []any{"hold", h.ID, "resource", h.Resource, "devices", h.Devices, "missing", now.Sub(since).Round(time.Millisecond)}
		if h.Pod != nil {
			attrs = append(attrs, "pod", podName(*h.Pod))
		}
		p.log.Info("hold released: "+whyGone, attrs...)
	}
	for id := range r.lastSeen {
		if !current[id] {
			delete(r.lastSeen, id)
		}
	}
}

// match is the pod container that has the most of h's devices; on a tie
// (an init container and an app container share devices) the one h is
// bound to, then the first by namespace, name and container.
func match(h Hold, index map[devKey][]api.PodRef) (api.PodRef, bool) {
	votes := map[api.PodRef]int{}
	for _, id := range h.Devices {
		for _, ref := range index[devKey{h.Resource, id}] {
			votes[ref]++
		}
	}
	var best api.PodRef
	n := 0
	for ref, v := range votes {
		if n == 0 || better(h, ref, v, best, n) {
			best, n = ref, v
		}
	}
	return best, n > 0
}

// better says whether ref, with v of the hold's devices, is a better match
// for h than best with n.
func better(h Hold, ref api.PodRef, v int, best api.PodRef, n int) bool {
	if v != n {
		return v > n
	}
	if h.Pod != nil && samePod(*h.Pod, ref) != samePod(*h.Pod, best) {
		return samePod(*h.Pod, ref)
	}
	return cmp.Or(cmp.Compare(ref.Namespace, best.Namespace), cmp.Compare(ref.Name, best.Name), cmp.Compare(ref.Container, best.Container)) < 0
}

// samePod compares what kubelet's pod-resources API tells of a pod: its
// v1 API has no pod UID (reconcile takes it from kubelet's checkpoint).
func samePod(a, b api.PodRef) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.Container == b.Container
}

func podName(r api.PodRef) string {
	return fmt.Sprintf("%s/%s/%s", r.Namespace, r.Name, r.Container)
}

// listPods asks kubelet's pod-resources API for every pod's devices. Each
// call dials afresh: a connection kept across a kubelet outage would come
// back only after gRPC's reconnect backoff.
func (p *Plugin) listPods(ctx context.Context) (*podresources.ListPodResourcesResponse, error) {
	conn, err := grpc.NewClient("unix://"+p.cfg.PodResources,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPodResourcesMsg)))
	if err != nil {
		return nil, fmt.Errorf("pod resources: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, p.t.rpcTimeout)
	defer cancel()
	resp, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("pod resources: %w", err)
	}
	return resp, nil
}
