// Command nimbus is the whole Nimbus cloud in one binary.
//
//	nimbus serve [flags]   run a controller (identity, compute, image, network, billing) and its local agent
//	nimbus agent [flags]   run a host agent, one per hypervisor host
//	nimbus admin …         the operator's commands on the controller's database
//	nimbus version         print the version
package main

import (
	"fmt"
	"nimbus/internal/version"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "agent":
		err = agentCmd(os.Args[2:])
	case "bench":
		err = bench(os.Args[2:])
	case "admin":
		err = admin(os.Args[2:])
	case "docs": // hidden: writes docs/reference/flags.md
		err = docsCmd(os.Args[2:])
	case "version", "--version":
		fmt.Println("nimbus", version.Get().Long())
	case "help", "-h", "--help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "nimbus: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nimbus:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `Usage: nimbus <command> [flags]

Commands:
  serve     run a Nimbus controller with its local fleet
  agent     run a host agent on a hypervisor host (see nimbus agent -h)
  bench     measure a running or in-process Nimbus (see nimbus bench -h)
  admin     the operator's commands, e.g. nimbus admin billing run (see nimbus admin -h)
  version   print the version

Run "nimbus <command> -h" for the flags of a command.
`)
}
