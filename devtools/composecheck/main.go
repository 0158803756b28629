// composecheck loads a Compose file with compose-go, the library Docker Compose itself uses,
// with every profile enabled: it validates the file against the Compose specification's JSON
// schema, resolves interpolation, merges anchors and checks references (depends_on, volumes,
// networks). On success it prints the normalized project as JSON; on failure, the error.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck docker-compose.yaml")
		os.Exit(2)
	}
	options, err := cli.NewProjectOptions(
		[]string{os.Args[1]},
		cli.WithOsEnv,
		cli.WithProfiles([]string{"*"}),
		cli.WithResolvedPaths(false),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid options:", err)
		os.Exit(1)
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid compose file:", err)
		os.Exit(1)
	}
	out, err := json.MarshalIndent(project, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
