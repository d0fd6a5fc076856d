package store

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fusiond/fusiond/daemon/api"
)

// goldenJob sets every field of a job record.
func goldenJob() api.Job {
	created := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	started, finished := created.Add(time.Second), created.Add(time.Minute)
	healthy := false
	return api.Job{
		ID: "7",
		Spec: api.JobSpec{
			Name: "train", Class: api.ClassTraining, Tier: api.TierGuaranteed, Priority: 10,
			Command: []string{"python", "train.py"}, Env: map[string]string{"A": "1"}, Workdir: "/home/u",
			Resources: api.Resources{CPU: 4000, Memory: 8 << 30,
				GPU: &api.GPURequest{Count: 1, Model: "H200", MIG: "1g.18gb", Share: 250, Memory: 1 << 30}, FPGA: &api.FPGARequest{Bitstream: "aes"}},
			Topology: api.TopologySingleNUMANode, Gang: &api.Gang{Name: "g", Size: 2},
			Restart: &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 3}, Labels: map[string]string{"team": "ml"},
			Rootfs: "/srv/rootfs",
		},
		Owner: api.Owner{UID: 1000, GID: 1000, Groups: []uint32{10}, User: "u"},
		Tier:  api.TierGuaranteed, State: api.StateFailed, Reason: "exit 1", Attempt: 2,
		Allocation: &api.Allocation{CPU: 4000, Memory: 8 << 30, CPUSet: "0-3", NUMANode: 1, Devices: []string{"GPU-1"},
			GPUs: []string{"GPU-1"}, GPUShare: &api.GPUShare{GPU: "GPU-2", Milli: 250, MemoryMB: 1024},
			MIG:  &api.MIGAllocation{GPU: "GPU-3", Profile: "1g.18gb", Start: 2, Instance: "MIG-1"},
			FPGA: &api.FPGAAllocation{Region: "fpga0.r0", Bitstream: "aes", Program: true}, Explain: "why"},
		Exit: &api.ExitStatus{Code: 1, Signal: "SIGKILL", OOMKilled: true},
		PID:  4242,
		Events: []api.Event{{Time: created, From: api.StatePending, To: api.StatePlaced, Reason: "placed"},
			{Time: started, Kind: api.EventDevice, Device: "GPU-1", Healthy: &healthy, Xid: 79, Reason: "xid"}},
		CreatedAt: created, StartedAt: &started, FinishedAt: &finished, Version: 9,
		Usage: &api.Usage{CPUSeconds: 1.5, ThrottledSeconds: 0.25, ThrottledPeriods: 3, MemoryPeak: 1 << 20, MemoryCurrent: 4096,
			OOMKills: 1, Pressure: &api.Pressure{CPU: 1, Memory: 2, IO: 3}},
	}
}

// goldenRecord is goldenJob as schema 1 stored it before the store had its
// own record type: the encoding of api.Job. Existing databases hold these
// bytes; they must keep loading, and new writes must produce them.
const goldenRecord = `{"id":"7","spec":{"name":"train","class":"training","tier":"guaranteed","priority":10,"command":["python","train.py"],"env":{"A":"1"},"workdir":"/home/u","resources":{"cpu":"4","memory":"8Gi","gpu":{"count":1,"model":"H200","mig":"1g.18gb","share":250,"memory":"1Gi"},"fpga":{"bitstream":"aes"}},"topology":"single-numa-node","gang":{"name":"g","size":2},"restart":{"policy":"on-failure","max_retries":3},"labels":{"team":"ml"},"rootfs":"/srv/rootfs"},"owner":{"uid":1000,"gid":1000,"groups":[10],"user":"u"},"tier":"guaranteed","state":"failed","reason":"exit 1","attempt":2,"allocation":{"cpu":"4","memory":"8Gi","cpuset":"0-3","numa_node":1,"devices":["GPU-1"],"gpus":["GPU-1"],"gpu_share":{"gpu":"GPU-2","milli":250,"memory_mb":1024},"mig":{"gpu":"GPU-3","profile":"1g.18gb","start":2,"instance":"MIG-1"},"fpga":{"region":"fpga0.r0","bitstream":"aes","program":true},"explain":"why"},"exit":{"code":1,"signal":"SIGKILL","oom_killed":true},"pid":4242,"events":[{"time":"2026-03-01T12:00:00Z","from":"pending","to":"placed","reason":"placed"},{"time":"2026-03-01T12:00:01Z","kind":"device","reason":"xid","device":"GPU-1","healthy":false,"xid":79}],"created_at":"2026-03-01T12:00:00Z","started_at":"2026-03-01T12:00:01Z","finished_at":"2026-03-01T12:01:00Z","version":9,"usage":{"cpu_seconds":1.5,"throttled_seconds":0.25,"throttled_periods":3,"memory_peak":"1Mi","memory_current":"4Ki","oom_kills":1,"pressure":{"cpu":1,"memory":2,"io":3}}}`

func TestRecordDecodesOldEncoding(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketJobs).Put(seqKey(7), []byte(goldenRecord)) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s = open(t, path, Options{})
	got, err := s.GetJob("7")
	if err != nil {
		t.Fatal(err)
	}
	if want := goldenJob(); !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	n := 0
	if err := s.Jobs(func(j api.Job) error {
		n++
		if !reflect.DeepEqual(j, got) {
			t.Errorf("Jobs gave %+v", j)
		}
		return nil
	}); err != nil || n != 1 {
		t.Fatalf("Jobs: %d records, %v", n, err)
	}
}

func TestRecordEncodesAsBefore(t *testing.T) {
	b, err := json.Marshal(recordOf(goldenJob()))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != goldenRecord {
		t.Fatalf("record encodes as\n%s\nwant\n%s", b, goldenRecord)
	}
	s := open(t, filepath.Join(t.TempDir(), "db"), Options{})
	j := goldenJob()
	j.ID = "1"
	if err := s.PutJob(j); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := s.db.View(func(tx *bolt.Tx) error {
		raw = bytes.Clone(tx.Bucket(bucketJobs).Get(seqKey(1)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := bytes.Replace([]byte(goldenRecord), []byte(`"id":"7"`), []byte(`"id":"1"`), 1); !bytes.Equal(raw, want) {
		t.Fatalf("stored\n%s\nwant\n%s", raw, want)
	}
}

// TestRecordCoversJob keeps Record's fields in step with api.Job's (their
// tags may differ: the record's are pinned by goldenRecord): a field added
// to the wire type must be added to the record on purpose, or the conversion
// would drop it silently.
func TestRecordCoversJob(t *testing.T) {
	// Fields of api.Job the daemon measures live on every read and never
	// stores.
	liveOnly := map[string]string{"Latency": "run-queue latency, read from the QoS loop on GET"}
	jt, rt := reflect.TypeFor[api.Job](), reflect.TypeFor[Record]()
	var jobFields []reflect.StructField
	for i := range jt.NumField() {
		if _, live := liveOnly[jt.Field(i).Name]; !live {
			jobFields = append(jobFields, jt.Field(i))
		}
	}
	if len(jobFields) != rt.NumField() {
		t.Fatalf("api.Job has %d stored fields, Record %d", len(jobFields), rt.NumField())
	}
	for i, jf := range jobFields {
		rf := rt.Field(i)
		if jf.Name != rf.Name || jf.Type != rf.Type {
			t.Errorf("field %d: api.Job %s %s, Record %s %s", i, jf.Name, jf.Type, rf.Name, rf.Type)
		}
	}
	if got := recordOf(goldenJob()).Job(); !reflect.DeepEqual(got, goldenJob()) {
		t.Fatalf("round trip lost fields: %+v", got)
	}
}

// A preempted job's preemptor and count are stored (the count decides how
// many retries a restarted job has left); records from before preemption
// decode with neither (TestRecordDecodesOldEncoding).
func TestRecordKeepsPreemption(t *testing.T) {
	j := goldenJob()
	j.State, j.PreemptedBy, j.Preemptions = api.StatePreempted, "12", 2
	s := open(t, filepath.Join(t.TempDir(), "db"), Options{})
	if err := s.PutJob(j); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetJob(j.ID)
	if err != nil || got.PreemptedBy != "12" || got.Preemptions != 2 || got.State != api.StatePreempted {
		t.Fatalf("stored preempted job read back as state %s, preempted_by %q, preemptions %d (%v)", got.State, got.PreemptedBy, got.Preemptions, err)
	}
}

// A job being moved keeps its marker and count across a restart: the
// next daemon queues a victim it finds marked again rather than recording
// its end as a failure (docs/scheduling.md, "Defragmentation").
func TestRecordKeepsMoves(t *testing.T) {
	j := goldenJob()
	j.Moves, j.MovingFor = 3, "12"
	s := open(t, filepath.Join(t.TempDir(), "db"), Options{})
	if err := s.PutJob(j); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetJob(j.ID)
	if err != nil || got.Moves != 3 || got.MovingFor != "12" {
		t.Fatalf("stored moving job read back with moves %d, moving_for %q (%v)", got.Moves, got.MovingFor, err)
	}
}

// A job being stopped at its max_runtime keeps the mark across a restart:
// the next daemon records its end as failed at its limit, not retried
// (docs/scheduling.md, "Run-time limit").
func TestRecordKeepsStoppedOvertime(t *testing.T) {
	j := goldenJob()
	j.StoppedOvertime = "exceeded max_runtime 1h0m0s"
	s := open(t, filepath.Join(t.TempDir(), "db"), Options{})
	if err := s.PutJob(j); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetJob(j.ID)
	if err != nil || got.StoppedOvertime != j.StoppedOvertime {
		t.Fatalf("stored job being stopped at its limit read back with stopped_overtime %q (%v)", got.StoppedOvertime, err)
	}
}
