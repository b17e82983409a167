package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	// Client auth plugins, as the upstream kubectl binary links them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func runAPIServer() int {
	return cli.Run(apiserver.NewAPIServerCommand())
}

func runControllerManager() int {
	return cli.Run(controllermanager.NewControllerManagerCommand())
}

func runScheduler() int {
	return cli.Run(scheduler.NewSchedulerCommand())
}

func runKubectl() int {
	// As upstream cmd/kubectl: set verbosity before the command is built.
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func runEtcd() int {
	// etcdmain.Main parses os.Args itself and exits on fatal errors.
	etcdmain.Main(os.Args)
	return 0
}
