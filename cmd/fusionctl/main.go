// Command fusionctl is the command-line client of fusiond.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fusiond/fusiond/cmd/fusionctl/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
