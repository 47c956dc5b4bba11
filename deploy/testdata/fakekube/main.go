// Command fakekube stands in for kubectl and go in TestOpsRotationBlocks: it runs the commands
// docs/OPERATIONS.md's "Rotating secrets" blocks use against a cluster kept as JSON in the file
// $FAKEKUBE_STATE, and fails on any other, so a block that grows a command the test does not
// know fails the test. Run as "go" it does what the blocks run with Go: `dispatch register`
// (a registration per pool) and `nk -gen user -pubout` (a real nkey pair). The keys Job
// (`create job --from=cronjob/keys-renew`) does what installsecrets.Ensure does to the CA, the
// bundle, the gateway's certificate and the runner registrations, in miniature.
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nats-io/nkeys"
)

// State is the fake cluster.
type State struct {
	// Secrets and ConfigMaps by "namespace/name": Secret data base64 as in the API, ConfigMap
	// data as is.
	Secrets    map[string]map[string]string `json:"secrets"`
	ConfigMaps map[string]map[string]string `json:"configmaps"`
	Pods       []Pod                        `json:"pods"`
	// Log holds every command line, in order.
	Log []string `json:"log"`
	// Serial numbers new names and keys.
	Serial int `json:"serial"`
}

// Pod is a Pod of the fake cluster.
type Pod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Phase     string            `json:"phase"`
	Labels    map[string]string `json:"labels"`
}

func main() {
	if err := run(filepath.Base(os.Args[0]), os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "fakekube: %s %q: %v\n", filepath.Base(os.Args[0]), os.Args[1:], err)
		os.Exit(1)
	}
}

func run(name string, args []string) error {
	if name == "go" {
		return goCommand(args)
	}
	// The blocks pipe one kubectl into another: apply takes its input before the state's lock,
	// which the command before it in the pipe holds until it exits.
	if slices.Contains(args, "apply") {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		stdin = b
	}
	path := os.Getenv("FAKEKUBE_STATE")
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	s.Log = append(s.Log, strings.Join(args, " "))
	if err := s.kubectl(args); err != nil {
		return err
	}
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

// goCommand is `go run ./functions/dispatch register` and `go run .../nk -gen user -pubout`.
func goCommand(args []string) error {
	switch {
	case len(args) == 3 && args[0] == "run" && args[1] == "./functions/dispatch" && args[2] == "register":
		if os.Getenv("GDR_GITEA_URL") == "" || os.Getenv("GDR_REGISTRATION_TOKEN") == "" {
			return fmt.Errorf("register: GDR_GITEA_URL and GDR_REGISTRATION_TOKEN are required")
		}
		if _, err := os.Stat(os.Getenv("GDR_POOLS_FILE")); err != nil {
			return err
		}
		p := filepath.Join(os.Getenv("GDR_STATE_DIR"), "linux.json")
		if _, err := os.Stat(p); err == nil {
			return nil // already registered
		}
		return os.WriteFile(p, []byte(`{"id":2,"uuid":"new","token":"new-token","name":"gitea-dynamic-runner-linux"}`), 0o600)
	case len(args) == 5 && args[0] == "run" && strings.HasPrefix(args[1], "github.com/nats-io/nkeys/nk@") && args[2] == "-gen" && args[3] == "user" && args[4] == "-pubout":
		kp, err := nkeys.CreateUser()
		if err != nil {
			return err
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		fmt.Printf("%s\n%s\n", seed, pub)
		return nil
	}
	return fmt.Errorf("unknown go command")
}

func (s *State) kubectl(args []string) error {
	ns := "default"
	if len(args) > 1 && args[0] == "-n" {
		ns, args = args[1], args[2:]
	}
	if len(args) < 2 {
		return fmt.Errorf("too few arguments")
	}
	verb, kind := args[0], args[1]
	flags := map[string]string{}
	var pos []string
	for i := 2; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" || a == "-p" || a == "-l" || a == "-f":
			flags[a] = args[i+1]
			i++
		case strings.HasPrefix(a, "--"):
			k, v, _ := strings.Cut(a, "=")
			if _, dup := flags[k]; dup && k == "--from-file" {
				flags[k] += "\x00" + v
			} else {
				flags[k] = v
			}
			if (k == "--type" || k == "--patch-file") && !strings.Contains(a, "=") {
				flags[k] = args[i+1]
				i++
			}
		default:
			pos = append(pos, a)
		}
	}
	switch verb + " " + kind {
	case "get secret", "get configmap":
		objs := s.Secrets
		if kind == "configmap" {
			objs = s.ConfigMaps
		}
		obj, ok := objs[ns+"/"+pos[0]]
		if !ok {
			return fmt.Errorf("%s %s not found", kind, pos[0])
		}
		switch o := flags["-o"]; {
		case o == "yaml":
			out, _ := json.Marshal(obj)
			fmt.Println(string(out))
		case strings.HasPrefix(o, "jsonpath={.data.") && strings.HasSuffix(o, "}"):
			fmt.Print(obj[strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(o, "jsonpath={.data."), "}"), `\.`, ".")])
		default:
			return fmt.Errorf("output %q", o)
		}
		return nil
	case "patch secret", "patch configmap":
		if flags["--type"] != "merge" {
			return fmt.Errorf("patch type %q", flags["--type"])
		}
		patch := flags["-p"]
		if f, ok := flags["--patch-file"]; ok {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			patch = string(b)
		}
		var p struct {
			Data map[string]*string `json:"data"`
		}
		if err := json.Unmarshal([]byte(patch), &p); err != nil {
			return fmt.Errorf("patch: %v", err)
		}
		objs := s.Secrets
		if kind == "configmap" {
			objs = s.ConfigMaps
		}
		obj, ok := objs[ns+"/"+pos[0]]
		if !ok {
			return fmt.Errorf("%s %s not found", kind, pos[0])
		}
		for k, v := range p.Data {
			if v == nil {
				delete(obj, k)
				continue
			}
			if kind == "secret" {
				if _, err := base64.StdEncoding.DecodeString(*v); err != nil {
					return fmt.Errorf("secret data %s is not base64", k)
				}
			}
			obj[k] = *v
		}
		return nil
	case "delete secret":
		if _, ok := s.Secrets[ns+"/"+pos[0]]; !ok && flags["--ignore-not-found"] == "" {
			return fmt.Errorf("secret %s not found", pos[0])
		}
		delete(s.Secrets, ns+"/"+pos[0])
		return nil
	case "create secret", "create configmap":
		return s.create(ns, kind, pos, flags)
	case "apply --server-side":
		return s.apply()
	case "rollout restart", "rollout status":
		for _, p := range pos {
			what, name, ok := strings.Cut(p, "/")
			if !ok || (what != "deployment" && what != "statefulset") {
				return fmt.Errorf("rollout of %q", p)
			}
			if verb+" "+kind == "rollout restart" && what == "deployment" {
				s.restart(ns, name)
			}
		}
		return nil
	case "get pods":
		sel, ok := flags["-l"]
		k, v, eq := strings.Cut(sel, "=")
		values := []string{v}
		if in, set, isSet := strings.Cut(sel, " in ("); isSet && strings.HasSuffix(set, ")") {
			k, values, eq = in, strings.Split(strings.TrimSuffix(set, ")"), ","), true
		}
		if !ok || !eq || flags["--field-selector"] != "status.phase!=Succeeded,status.phase!=Failed" || flags["-o"] != "name" {
			return fmt.Errorf("get pods %v", flags)
		}
		for _, p := range s.Pods {
			if p.Namespace == ns && slices.Contains(values, p.Labels[k]) && p.Phase != "Succeeded" && p.Phase != "Failed" {
				fmt.Println("pod/" + p.Name)
			}
		}
		return nil
	case "wait --for=condition=Active=False", "wait --for=condition=Ready=True", "wait --for=condition=complete":
		return nil
	case "create job":
		if flags["--from"] != "cronjob/keys-renew" {
			return fmt.Errorf("create job %v", flags)
		}
		return s.keysJob(ns)
	}
	return fmt.Errorf("unknown command")
}

// restart replaces the Pods of deployment name.
func (s *State) restart(ns, name string) {
	s.Pods = slices.DeleteFunc(s.Pods, func(p Pod) bool { return p.Namespace == ns && p.Labels["app.kubernetes.io/name"] == name })
	s.Serial++
	s.Pods = append(s.Pods, Pod{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, s.Serial), Phase: "Running",
		Labels: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "gitea-dynamic-runner"}})
}

// create prints the object `create ... --dry-run=client -o yaml` would.
func (s *State) create(ns, kind string, pos []string, flags map[string]string) error {
	if flags["--dry-run"] != "client" || flags["-o"] != "yaml" || (kind == "secret" && (len(pos) != 2 || pos[0] != "generic")) {
		return fmt.Errorf("create %s without --dry-run=client -o yaml", kind)
	}
	name := pos[len(pos)-1]
	data := map[string]string{}
	add := func(key, value string) {
		if kind == "secret" {
			value = base64.StdEncoding.EncodeToString([]byte(value))
		}
		data[key] = value
	}
	if env, ok := flags["--from-env-file"]; ok {
		b, err := os.ReadFile(env)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return fmt.Errorf("env file line %q", line)
			}
			add(k, v)
		}
	}
	for _, f := range strings.Split(flags["--from-file"], "\x00") {
		if f == "" {
			continue
		}
		key, path, ok := strings.Cut(f, "=")
		if !ok {
			key, path = "", f
		}
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			entries, err := os.ReadDir(path)
			if err != nil {
				return err
			}
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(path, e.Name()))
				if err != nil {
					return err
				}
				add(e.Name(), string(b))
			}
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if key == "" {
			key = filepath.Base(path)
		}
		add(key, string(b))
	}
	out, _ := json.Marshal(map[string]any{"kind": map[string]string{"secret": "Secret", "configmap": "ConfigMap"}[kind],
		"metadata": map[string]string{"name": name, "namespace": ns}, "data": data})
	fmt.Println(string(out))
	return nil
}

// stdin is apply's input.
var stdin []byte

// apply takes the object create printed, from stdin, whole.
func (s *State) apply() error {
	b := stdin
	var o struct {
		Kind     string            `json:"kind"`
		Metadata map[string]string `json:"metadata"`
		Data     map[string]string `json:"data"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return fmt.Errorf("apply: %v", err)
	}
	key := o.Metadata["namespace"] + "/" + o.Metadata["name"]
	switch o.Kind {
	case "Secret":
		s.Secrets[key] = o.Data
	case "ConfigMap":
		s.ConfigMaps[key] = o.Data
	default:
		return fmt.Errorf("apply of %q", o.Kind)
	}
	return nil
}

// keysJob is installsecrets.Ensure in miniature: a CA made when gdr-identity-ca is absent, its
// root added to the bundle, the gateway's certificate issued again by the current CA when the
// bundle lacks its issuer, and the registrations of pools gdr-runner-credentials lacks.
func (s *State) keysJob(ns string) error {
	enc := func(v string) string { return base64.StdEncoding.EncodeToString([]byte(v)) }
	dec := func(v string) string { b, _ := base64.StdEncoding.DecodeString(v); return string(b) }
	ca, ok := s.Secrets[ns+"/gdr-identity-ca"]
	if !ok {
		s.Serial++
		ca = map[string]string{"ca.pem": enc(fmt.Sprintf("ROOT-%d\n", s.Serial)), "ca-key.pem": enc("KEY")}
		s.Secrets[ns+"/gdr-identity-ca"] = ca
	}
	root := dec(ca["ca.pem"])
	bundle := s.ConfigMaps[ns+"/gdr-identity-bundle"]
	if !strings.Contains(bundle["bundle.pem"], root) {
		bundle["bundle.pem"] += root
	}
	gw := s.Secrets[ns+"/gdr-gateway-svid"]
	if !strings.Contains(bundle["bundle.pem"], dec(gw["issuer"])) {
		gw["issuer"] = ca["ca.pem"]
	}
	if _, ok := s.Secrets[ns+"/gdr-runner-credentials"]; !ok {
		s.Serial++
		s.Secrets[ns+"/gdr-runner-credentials"] = map[string]string{"linux.json": enc(fmt.Sprintf(`{"id":%d}`, s.Serial))}
	}
	return nil
}
