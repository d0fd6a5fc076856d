package systemd

import _ "embed"

// ServiceUnit and SocketUnit are the unit files as shipped; the packages
// install them into /usr/lib/systemd/system.
var (
	//go:embed fusiond.service
	ServiceUnit []byte
	//go:embed fusiond.socket
	SocketUnit []byte
)
