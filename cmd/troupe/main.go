// Command troupe serves large language models as a troupe of actors.
//
// Run `troupe help` for the subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "serve a model over HTTP (OpenAI API, websocket, demo page)", cmdServe},
		{"run", "stream a completion of a prompt to the terminal", cmdRun},
		{"generate", "generate from token ids and print JSON", cmdGenerate},
		{"tokenize", "tokenize a JSON array of strings read from stdin", cmdTokenize},
		{"inspect", "check a checkpoint and report what it needs", cmdInspect},
		{"pull", "fetch a checkpoint from the Hugging Face Hub into its cache", cmdPull},
		{"bench", "measure prefill and decode speed", cmdBench},
		{"synth", "write a random-weight checkpoint of a real model's shape", cmdSynth},
		{"trace", "print the per-token latency breakdown of a request", cmdTrace},
		{"cluster", "print a cluster's nodes, placements and actors", cmdCluster},
		{"scale", "change the number of replicas a server runs, while it serves", cmdScale},
		{"probe", "print the data-plane topology: host fabric and GPU peer links", cmdProbe},
		{"allreduce-bench", "measure all-reduce on the data plane (nccl-tests table)", cmdAllReduceBench},
		{"version", "print the build: version, source revision, Go, CUDA kernels", cmdVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "troupe:", err)
		}
		os.Exit(1)
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return nil
	}
	if args[0] == "--version" || args[0] == "-version" {
		return cmdVersion(ctx, args[1:], stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: troupe <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-16s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `troupe <command> -h` for a command's flags.")
}

// flags returns a flag set that reports errors instead of exiting.
func flags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("troupe "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
