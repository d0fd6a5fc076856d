package sched

import (
	"errors"
	"fmt"
)

// PlaceGang places every member of a gang or none. Members are placed one
// after the other, each seeing the previous ones applied; on any failure
// everything applied so far is released again and the error returned, so
// a gang never holds a partial allocation.
func (e *Engine) PlaceGang(reqs []Request, nodes []*Node) ([]Assignment, error) {
	out := make([]Assignment, 0, len(reqs))
	rollback := func() {
		for i := len(out) - 1; i >= 0; i-- {
			e.Release(&reqs[i], &out[i], nodes)
		}
	}
	for i := range reqs {
		d, err := e.Place(&reqs[i], nodes)
		if err == nil {
			err = e.Commit(&reqs[i], &d.Assignment, nodes)
		}
		if err != nil {
			rollback()
			return nil, fmt.Errorf("gang member %d (%s): %w", i, reqs[i].ID, err)
		}
		out = append(out, d.Assignment)
	}
	return out, nil
}

// ErrNoPreemption means no set of lower-tier victims within the budget
// frees enough room.
var ErrNoPreemption = errors.New("sched: no preemption within budget frees room")
