package devices

import "testing"

func TestHub(t *testing.T) {
	var h Hub
	var got []string
	c1 := h.Subscribe(func(u Update) { got = append(got, "1:"+u.Device) })
	c2 := h.Subscribe(func(u Update) { got = append(got, "2:"+u.Device) })
	h.Publish(Update{Kind: DeviceChanged, Device: "a"})
	c1()
	h.Publish(Update{Kind: DeviceChanged, Device: "b"})
	c2()
	c2()
	h.Publish(Update{Kind: DeviceChanged, Device: "c"})
	want := []string{"1:a", "2:a", "2:b"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}
